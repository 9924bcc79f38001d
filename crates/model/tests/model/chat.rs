//! Chat templates with Hugging Face semantics.

use mlxcel_model::{ChatMessage, ChatTemplate, LoadedModel, ModelError, convert_gguf};

use crate::fixtures::{SMOLLM2_TEMPLATE, TinyLlama};

fn user(text: &str) -> ChatMessage {
    ChatMessage::new("user", text)
}

#[test]
fn smollm2_template_adds_default_system_and_generation_prompt() {
    let t = ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap();
    let rendered = t.render(&[user("Hi")], true).unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system = t
        .render(
            &[ChatMessage::new("system", "Be brief."), user("Hi")],
            false,
        )
        .unwrap();
    assert_eq!(
        with_system,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn hf_semantics_trim_blocks_bos_pycompat_and_raise_exception() {
    let source = "{{ bos_token }}{% for m in messages %}\n  {% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}\n[{{ m.role | upper }}] {{ m.content.strip() }}{{ eos_token }}\n{% endfor %}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let rendered = t
        .render(
            &[user("  hello  "), ChatMessage::new("assistant", "hi")],
            false,
        )
        .unwrap();
    assert_eq!(rendered, "<s>[USER] hello</s>\n[ASSISTANT] hi</s>\n");
    let message = t
        .render(&[ChatMessage::new("tool", "x")], false)
        .unwrap_err()
        .to_string();
    assert!(message.contains("bad role tool"), "{message}");
    assert!(
        ChatTemplate::new("{% for %}", "", "")
            .unwrap_err()
            .to_string()
            .contains("does not compile")
    );
}

#[test]
fn converted_checkpoint_carries_its_template_and_missing_one_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    for template in [Some(SMOLLM2_TEMPLATE), None] {
        TinyLlama {
            chat_template: template,
            ..TinyLlama::default()
        }
        .write(&gguf, 1);
        let out = dir.path().join(format!("ckpt-{}", template.is_some()));
        convert_gguf(&gguf, &out).unwrap();
        let model = LoadedModel::open(&out).unwrap();
        match template {
            Some(_) => {
                let prompt = model
                    .require_chat_template()
                    .unwrap()
                    .render(&[user("Hi")], true)
                    .unwrap();
                assert!(prompt.ends_with("<|im_start|>assistant\n"));
            }
            None => {
                let err = model.require_chat_template().unwrap_err();
                assert!(matches!(err, ModelError::NoChatTemplate { .. }));
                assert!(err.to_string().contains("--no-chat-template"));
            }
        }
    }
}

#[test]
fn tokenizer_config_list_form_and_jinja_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "bos_token": {"content": "<s>"}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}default"}]
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "<s>default");
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ eos_token }}jinja",
    )
    .unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "</s>jinja");
}

/// Llama 3 Instruct's template: `loop.index0`, `set`, and a filter binding tighter than `+`.
#[test]
fn llama3_template() {
    let source = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    let t = ChatTemplate::new(source, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    assert_eq!(
        t.render(&[user("  Hi \n")], true).unwrap(),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

/// Qwen2.5's template: whitespace control (`{%-`), attribute access, a default system prompt.
#[test]
fn qwen2_template() {
    let source = "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";
    let t = ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    let messages = [
        user("Hi"),
        ChatMessage::new("assistant", "Hello!"),
        user("2+2?"),
    ];
    assert_eq!(
        t.render(&messages, true).unwrap(),
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}
