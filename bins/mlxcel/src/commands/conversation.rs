//! A chat's conversation file (`/save FILE`, `/load FILE`): `{"messages": [{"role", "content"},
//! ...]}`, the messages as the chat template receives them (OpenAI's chat shape), the system
//! message included.

use std::path::Path;

use anyhow::{Context, Result, bail};
use mlxcel_engine::ChatMessage;
use serde_json::{Map, Value, json};

/// The roles a saved conversation may hold.
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Writes `messages` to `path` (replacing it).
pub fn save(path: &Path, messages: &[ChatMessage]) -> Result<()> {
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    let mut text = serde_json::to_string_pretty(&json!({ "messages": messages }))?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Reads the messages `path` holds.
pub fn load(path: &Path) -> Result<Vec<ChatMessage>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("{} is not a saved conversation", path.display()))
}

/// The messages of a conversation file's text; anything else in it is refused by name.
pub fn parse(text: &str) -> Result<Vec<ChatMessage>> {
    let value: Value = serde_json::from_str(text)?;
    let Value::Object(mut file) = value else {
        bail!("expected an object {{\"messages\": [...]}}");
    };
    let messages = file
        .remove("messages")
        .context("it has no \"messages\" array")?;
    if let Some(key) = file.keys().next() {
        bail!("unknown key \"{key}\" (a conversation file holds \"messages\" only)");
    }
    let Value::Array(messages) = messages else {
        bail!("\"messages\" is not an array");
    };
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| match message {
            Value::Object(fields) => message_of(fields).with_context(|| format!("message {i}")),
            _ => bail!("message {i} is not an object {{\"role\", \"content\"}}"),
        })
        .collect()
}

fn message_of(mut fields: Map<String, Value>) -> Result<ChatMessage> {
    let mut text = |key: &str| match fields.remove(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => bail!("\"{key}\" is not a string"),
        None => bail!("it has no \"{key}\""),
    };
    let role = text("role")?;
    let content = text("content")?;
    if !ROLES.contains(&role.as_str()) {
        bail!("role \"{role}\" is not one of {ROLES:?}");
    }
    if let Some(key) = fields.keys().next() {
        bail!("unknown key \"{key}\" (a message holds \"role\" and \"content\")");
    }
    Ok(ChatMessage::new(role, content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_messages_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.json");
        let messages = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi \"there\"\n"),
            ChatMessage::new("assistant", "Hello!"),
        ];
        save(&path, &messages).unwrap();
        assert_eq!(load(&path).unwrap(), messages);
    }

    #[test]
    fn anything_else_is_refused_by_name() {
        let error = |text: &str| format!("{:#}", parse(text).unwrap_err());
        assert!(error("[]").contains("expected an object"));
        assert!(error("{}").contains("no \"messages\""));
        assert!(error(r#"{"messages": [], "model": "x"}"#).contains("unknown key \"model\""));
        assert!(
            error(r#"{"messages": [{"role": "tool", "content": "x"}]}"#)
                .contains("message 0: role \"tool\"")
        );
        assert!(error(r#"{"messages": [{"role": "user"}]}"#).contains("no \"content\""));
        assert!(
            error(r#"{"messages": [{"role": "user", "content": "x", "name": "n"}]}"#)
                .contains("unknown key \"name\"")
        );
        assert!(error("{").contains("EOF"));
    }
}
