//! What a chat template can render, found by trial renders as llama-server reports it in
//! `/props` (`chat_template_caps`): llama.cpp renders a few probe conversations and watches which
//! of their values the template reads; minijinja does not track reads, so each probe here puts a
//! marker in the value and looks for it in the output (a value read but never printed counts as
//! unsupported). The probes and their names are llama.cpp's (common/jinja/caps.cpp).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::ChatTemplate;

/// The capabilities, under llama.cpp's names (a sorted map, as its `std::map` serializes).
pub type TemplateCaps = BTreeMap<&'static str, bool>;

const STRING_MARKER: &str = "STRING_MARKER_7c1";
const TYPED_MARKER: &str = "TYPED_MARKER_7c1";
const SYSTEM_MARKER: &str = "SYSTEM_MARKER_7c1";
const TOOL_MARKER: &str = "tool_marker_7c1";
const CALL_MARKER: &str = "call_marker_7c1";
const SECOND_CALL_MARKER: &str = "second_call_7c1";
const ARG_MARKER: &str = "ARG_MARKER_7c1";
const REASONING_MARKER: &str = "<REASONING_CONTENT_PLACEHOLDER>";
const EFFORT_MARKER: &str = "effort_marker_7c1";

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": TOOL_MARKER,
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"]
            }
        }
    }])
}

/// A conversation with one assistant turn that calls `calls` (name, arguments) and the tool's
/// reply, as llama.cpp's tool probes.
fn tool_conversation(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call0000{}", i + 1), "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    json!([
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"}
    ])
}

impl ChatTemplate {
    /// One probe: the output, or `None` when the template refuses the conversation.
    fn probe(&self, messages: Value, tools: Option<Value>, extra: Value) -> Option<String> {
        let mut context = json!({
            "messages": messages,
            "tools": tools.unwrap_or_else(|| json!([])),
            "bos_token": "",
            "eos_token": "",
            "add_generation_prompt": true
        });
        if let (Some(context), Some(extra)) = (context.as_object_mut(), extra.as_object()) {
            context.extend(extra.clone());
        }
        self.render_with(&context).ok()
    }

    /// The template's capabilities by trial renders (module docs).
    pub fn capabilities(&self) -> TemplateCaps {
        let user = |content: Value| json!([{"role": "user", "content": content}]);
        let has =
            |out: &Option<String>, marker: &str| out.as_ref().is_some_and(|o| o.contains(marker));
        let string = self.probe(user(json!(STRING_MARKER)), None, json!({}));
        let typed = self.probe(
            user(json!([{"type": "text", "text": TYPED_MARKER}])),
            None,
            json!({}),
        );
        let system = self.probe(
            json!([{"role": "system", "content": SYSTEM_MARKER},
                   {"role": "user", "content": "User message"}]),
            None,
            json!({}),
        );
        let object_call = self.probe(
            tool_conversation(&[(CALL_MARKER, json!({"arg": ARG_MARKER}))]),
            Some(tools()),
            json!({}),
        );
        let object_arguments = has(&object_call, ARG_MARKER);
        let arguments = |marker: &str| {
            if object_arguments {
                json!({"arg": marker})
            } else {
                json!(format!("{{\"arg\": \"{marker}\"}}"))
            }
        };
        let single = if object_arguments {
            object_call
        } else {
            self.probe(
                tool_conversation(&[(CALL_MARKER, arguments(ARG_MARKER))]),
                Some(tools()),
                json!({}),
            )
        };
        let parallel = self.probe(
            tool_conversation(&[
                (CALL_MARKER, arguments(ARG_MARKER)),
                (SECOND_CALL_MARKER, arguments(ARG_MARKER)),
            ]),
            Some(tools()),
            json!({}),
        );
        let thinking = json!({"enable_thinking": true, "preserve_thinking": true,
            "clear_thinking": false, "truncate_history_thinking": false, "drop_thinking": false});
        let reasoning = self.probe(
            json!([
                {"role": "user", "content": "User message"},
                {"role": "assistant", "content": "Assistant message",
                 "reasoning_content": REASONING_MARKER},
                {"role": "user", "content": "User message"},
                {"role": "assistant", "content": "Assistant message",
                 "reasoning_content": "Reasoning content"},
                {"role": "user", "content": "User message"}
            ]),
            None,
            thinking,
        );
        // Effort: the template prints it, or renders differently with another value.
        let effort = |value: &str| {
            self.probe(
                user(json!("User message")),
                None,
                json!({"enable_thinking": true, "reasoning_effort": value,
                       "reasoning_strength": value}),
            )
        };
        let low = effort(EFFORT_MARKER);
        let reasoning_effort = has(&low, EFFORT_MARKER) || low != effort("high");
        let tool_calls = has(&single, CALL_MARKER);
        TemplateCaps::from([
            ("supports_string_content", has(&string, STRING_MARKER)),
            // The text printed from its part, not the part list printed whole.
            (
                "supports_typed_content",
                has(&typed, TYPED_MARKER)
                    && !has(&typed, &format!("'text': '{TYPED_MARKER}"))
                    && !has(&typed, &format!("\"text\": \"{TYPED_MARKER}")),
            ),
            ("supports_tools", has(&single, TOOL_MARKER)),
            ("supports_tool_calls", tool_calls),
            (
                "supports_parallel_tool_calls",
                tool_calls && has(&parallel, SECOND_CALL_MARKER),
            ),
            ("supports_system_role", has(&system, SYSTEM_MARKER)),
            (
                "supports_preserve_reasoning",
                has(&reasoning, REASONING_MARKER),
            ),
            ("supports_reasoning_effort", reasoning_effort),
            ("supports_object_arguments", object_arguments),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(source: &str) -> TemplateCaps {
        ChatTemplate::new(source, "", "").unwrap().capabilities()
    }

    #[test]
    fn chatml_prints_strings_and_system_but_no_tools() {
        let c = caps(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
             {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        );
        assert!(c["supports_string_content"] && c["supports_system_role"]);
        for cap in [
            "supports_typed_content",
            "supports_tools",
            "supports_tool_calls",
            "supports_parallel_tool_calls",
            "supports_preserve_reasoning",
            "supports_reasoning_effort",
            "supports_object_arguments",
        ] {
            assert!(!c[cap], "{cap}");
        }
        assert_eq!(c.len(), 9);
    }

    #[test]
    fn a_tool_template_is_seen_for_what_it_prints() {
        // Tools as JSON, each call's name and arguments (objects), typed parts' text; the
        // system role refused.
        let c = caps(
            "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}\
             {% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}\
             {% if m.content is string %}{{ m.content }}{% else %}\
             {% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}\
             {% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments | tojson }}\
             {% endfor %}{% endfor %}",
        );
        for cap in [
            "supports_string_content",
            "supports_typed_content",
            "supports_tools",
            "supports_tool_calls",
            "supports_parallel_tool_calls",
            "supports_object_arguments",
        ] {
            assert!(c[cap], "{cap}");
        }
        assert!(!c["supports_system_role"]);
        assert!(!c["supports_preserve_reasoning"]);
    }

    #[test]
    fn reasoning_probes() {
        let c = caps(
            "{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}\
             </think>{% endif %}{{ m.content }}{% endfor %}\
             {% if reasoning_effort == 'high' %}think hard{% endif %}",
        );
        assert!(c["supports_preserve_reasoning"]);
        assert!(c["supports_reasoning_effort"]);
    }
}
