//! `--chat-template NAME_OR_JINJA` and `--chat-template-file FILE`: the chat template that
//! replaces the checkpoint's. A name is one of llama.cpp's built-in templates that this module
//! writes out as Jinja (the same text llama.cpp's `llm_chat_apply_template` produces for it); any
//! other value that holds Jinja tags is a template itself; anything else is refused at start,
//! named, with the names there are.

use crate::error::ServerError;

/// The built-in templates, by llama.cpp's names, as Jinja over Hugging Face's context
/// (`messages`, `add_generation_prompt`). Like llama.cpp's, none writes the BOS token.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "chatml",
        r"{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}",
    ),
    (
        "llama3",
        r"{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}",
    ),
    (
        "command-r",
        r"{%- set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} -%}
{%- for message in messages if message['role'] in tokens -%}
{{- '<|START_OF_TURN_TOKEN|>' + tokens[message['role']] + (message['content'] | trim) + '<|END_OF_TURN_TOKEN|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}",
    ),
    (
        "gemma",
        r"{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + (message['content'] | trim) -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}{{- ns.system + '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
{{- (message['content'] | trim) + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}",
    ),
    (
        "phi3",
        r"{%- for message in messages -%}
{{- '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}",
    ),
    (
        "phi4",
        r"{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant<|im_sep|>' -}}{%- endif -%}",
    ),
    (
        "zephyr",
        r"{%- for message in messages -%}
{{- '<|' + message['role'] + '|>\n' + message['content'] + '<|endoftext|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}",
    ),
    (
        "falcon3",
        r"{%- for message in messages -%}
{{- '<|' + message['role'] + '|>\n' + message['content'] + '\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}",
    ),
];

/// The names `--chat-template` takes.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(name, _)| *name).collect()
}

/// The Jinja source that `--chat-template` (`inline`) or `--chat-template-file` (`file`) asks
/// for; `None` keeps the checkpoint's. Both at once is refused (llama.cpp would keep the last).
pub fn template_override(
    inline: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<Option<String>, ServerError> {
    match (inline, file) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(ServerError::Flag(
            "--chat-template and --chat-template-file both given: pass one".into(),
        )),
        (Some(value), None) => {
            if let Some((_, source)) = BUILT_IN.iter().find(|(name, _)| *name == value) {
                return Ok(Some((*source).to_owned()));
            }
            if value.contains("{{") || value.contains("{%") {
                return Ok(Some(value.to_owned()));
            }
            Err(ServerError::Flag(format!(
                "--chat-template {value}: not a built-in template name ({}) and not a Jinja \
                 template (no {{{{ or {{% tags); pass a Jinja file with --chat-template-file",
                built_in_names().join(", ")
            )))
        }
        (None, Some(path)) => std::fs::read_to_string(path).map(Some).map_err(|err| {
            ServerError::Flag(format!(
                "--chat-template-file {}: cannot read it: {err}",
                path.display()
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlxcel_model::{ChatMessage, ChatTemplate};

    fn render(name: &str, messages: &[(&str, &str)]) -> String {
        let source = template_override(Some(name), None).unwrap().unwrap();
        let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|(role, content)| ChatMessage::new(*role, *content))
            .collect();
        template.render(&messages, true).unwrap()
    }

    #[test]
    fn built_in_templates_write_what_llama_cpp_writes() {
        let chat = [("system", "You are a test."), ("user", "Hi there")];
        assert_eq!(
            render("command-r", &chat),
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        );
        assert_eq!(
            render("llama3", &[("user", " Hi ")]),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render("chatml", &chat),
            "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(
            render(
                "gemma",
                &[("system", "Be brief."), ("user", "Hi"), ("assistant", "Yo")]
            ),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nYo\
             <end_of_turn>\n<start_of_turn>model\n"
        );
        for name in built_in_names() {
            assert!(!render(name, &chat).is_empty(), "{name}");
        }
    }

    #[test]
    fn jinja_passes_and_unknown_names_are_refused_by_name() {
        let jinja = "{{ messages[0]['content'] }}";
        assert_eq!(
            template_override(Some(jinja), None).unwrap().as_deref(),
            Some(jinja)
        );
        let err = template_override(Some("no-such-template"), None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("no-such-template") && text.contains("chatml"),
            "{text}"
        );
        assert!(template_override(Some("chatml"), Some("x".as_ref())).is_err());
        let missing = template_override(None, Some("/no/such/file.jinja".as_ref()));
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("/no/such/file.jinja")
        );
        assert_eq!(template_override(None, None).unwrap(), None);
    }
}
