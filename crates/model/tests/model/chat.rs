//! Chat templates with Hugging Face semantics: the jinja2-proven corpus, errors that name the
//! line, and the checkpoint's template.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlxcel_model::{ChatMessage, ChatTemplate, LoadedModel, ModelError, convert_gguf};
use serde::Deserialize;

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

/// `tests/fixtures/chat_templates/corpus.json`: the cases and which template renders which.
#[derive(Deserialize)]
struct Corpus {
    special_tokens: SpecialTokens,
    now: String,
    cases: BTreeMap<String, Case>,
    renders: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
struct SpecialTokens {
    bos_token: String,
    eos_token: String,
}

#[derive(Deserialize)]
struct Case {
    now: Option<String>,
    /// Deserialized straight into a template value, so that maps keep the file's key order.
    context: minijinja::Value,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

/// Every template of the corpus renders every case it lists exactly as the expected file says:
/// the output byte for byte, or an error with the line and message jinja2 gave
/// (`scripts/check-chat-templates` proves the expected files with jinja2 itself).
#[test]
fn corpus_renders_as_jinja2_does() {
    let dir = corpus_dir();
    let corpus: Corpus =
        serde_json::from_str(&std::fs::read_to_string(dir.join("corpus.json")).unwrap()).unwrap();
    let mut renders = 0;
    let mut failures = Vec::new();
    for (name, cases) in &corpus.renders {
        let source = std::fs::read_to_string(dir.join("templates").join(name)).unwrap();
        let stem = name.trim_end_matches(".jinja");
        for case_name in cases {
            let case = &corpus.cases[case_name];
            let template = ChatTemplate::new(
                &source,
                &corpus.special_tokens.bos_token,
                &corpus.special_tokens.eos_token,
            )
            .unwrap()
            .with_fixed_now(case.now.as_deref().unwrap_or(&corpus.now))
            .unwrap();
            let ours = template.render_with(&case.context);
            renders += 1;
            let expected = |kind: &str| dir.join(format!("expected/{stem}.{case_name}.{kind}"));
            match (
                std::fs::read_to_string(expected("txt")),
                std::fs::read_to_string(expected("error")),
                ours,
            ) {
                (Ok(want), _, Ok(got)) if want == got => {}
                (_, Ok(want), Err(got)) if got.to_string().contains(want.trim_end()) => {}
                (want_txt, want_error, got) => failures.push(format!(
                    "{stem}.{case_name}:\n  expected {:?}\n  got      {:?}",
                    want_txt.or(want_error).unwrap_or_default(),
                    got.map_err(|e| e.to_string()),
                )),
            }
        }
    }
    let expected_files = std::fs::read_dir(dir.join("expected")).unwrap().count();
    assert_eq!(expected_files, renders, "one expected file per render");
    assert!(
        failures.is_empty(),
        "{} of {renders} renders differ from jinja2's:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What a template outputs, or its error as text.
fn outcome(source: &str, context: serde_json::Value) -> Result<String, String> {
    ChatTemplate::new(source, "<s>", "</s>")
        .and_then(|t| t.render_with(&context))
        .map_err(|e| e.to_string())
}

#[test]
fn an_unknown_filter_names_its_line() {
    let source = "{# one #}\n{{ messages | length }}\n{{ messages | no_such_filter }}\n";
    let err = outcome(source, serde_json::json!({"messages": []})).unwrap_err();
    assert!(err.contains("line 3:"), "{err}");
    assert!(err.contains("no_such_filter"), "{err}");
    assert!(
        err.contains("(in `{{ messages | no_such_filter }}`)"),
        "{err}"
    );
}

/// minijinja 2.24 panicked when a negative-step slice met an empty string or list (`''[::-1]`,
/// `messages[::-1]` with no messages, an idiom of real chat templates; the chat_template fuzzer
/// found it). minijinja 3 clamps the bounds: these render as jinja2 renders them.
#[test]
fn negative_step_slices_of_empty_sequences_render_as_in_jinja2() {
    for (source, expected) in [
        (
            "{{ ''[::-1] }}|{{ 'abc'[::-1] }}|{{ 'abc'[5:0:-1] }}",
            "|cba|cb",
        ),
        ("{% for m in messages[::-1] %}{{ m.role }}{% endfor %}", ""),
    ] {
        let out = outcome(source, serde_json::json!({"messages": []})).unwrap();
        assert_eq!(out, expected, "{source}");
    }
    let reversed = outcome(
        "{% for m in messages[::-1] %}{{ m.role }} {% endfor %}",
        serde_json::json!({"messages": [{"role": "user", "content": "a"},
                                        {"role": "assistant", "content": "b"}]}),
    )
    .unwrap();
    assert_eq!(reversed, "assistant user ");
}

#[test]
fn a_syntax_error_names_its_line() {
    let err = ChatTemplate::new("{% for m in messages %}\n{{ m.role }}\n{% endif %}", "", "")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not compile: line 3: syntax error"),
        "{err}"
    );
}

#[test]
fn endless_recursion_stops_with_an_error_naming_the_line() {
    let source = "{% macro again(n) %}\n{{ again(n + 1) }}\n{% endmacro %}\n{{ again(0) }}";
    let err = outcome(source, serde_json::json!({"messages": []})).unwrap_err();
    assert!(err.contains("line 2:"), "{err}");
}

#[test]
fn a_loop_that_would_run_for_hours_runs_out_of_fuel() {
    let source = "{% for a in range(100000) %}\n{% for b in range(100000) %}{{ '' }}{% endfor %}\n{% endfor %}";
    let started = std::time::Instant::now();
    let err = outcome(source, serde_json::json!({"messages": []})).unwrap_err();
    assert!(
        err.contains("instructions (does it loop forever?)"),
        "{err}"
    );
    assert!(err.contains("line 2:"), "{err}");
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

/// An untrusted template that would print without bound is refused fast, with the line and the
/// bound named: a repeated string (minijinja refuses one over 100 MB), a loop printing a large
/// string, the same inside a macro or a `set` block (captured before it reaches the output), and
/// template text repeated by a loop.
#[test]
fn a_template_that_prints_gigabytes_is_refused_fast() {
    let started = std::time::Instant::now();
    let err = outcome("{{ 'x' * 10**9 }}", serde_json::json!({"messages": []})).unwrap_err();
    assert!(
        err.contains("line 1:") && err.contains("too large"),
        "{err}"
    );
    let limit = format!(
        "printed more than {} MiB",
        mlxcel_model::MAX_RENDER_BYTES >> 20
    );
    for source in [
        "{% for i in range(100000) %}\n{{ 'x' * 10000000 }}{% endfor %}",
        "{% macro m() %}{% for i in range(100000) %}\n{{ 'x' * 10000000 }}{% endfor %}{% endmacro %}{{ m() }}",
        "{% set s %}{% for i in range(100000) %}\n{{ 'x' * 10000000 }}{% endfor %}{% endset %}{{ s }}",
        "{% for i in range(100000) %}{% for j in range(10000) %}\n{{ 'x' * (1000 + j) }}{% endfor %}{% endfor %}",
    ] {
        let err = outcome(source, serde_json::json!({"messages": []})).unwrap_err();
        assert!(err.contains(&limit), "{source}: {err}");
        assert!(err.contains("line 2:"), "{source}: {err}");
    }
    let raw = format!(
        "{{% for i in range(100000) %}}{}{{% endfor %}}",
        "y".repeat(1000)
    );
    let err = outcome(&raw, serde_json::json!({"messages": []})).unwrap_err();
    assert!(err.contains(&limit), "{err}");
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
}

/// Instructions that are each expensive (copying a 50 MB string that is never printed) are cheap
/// in fuel; the render's time bound stops them at the next thing printed.
#[test]
fn a_template_that_runs_past_its_time_is_refused() {
    let source =
        "{% for i in range(100000) %}{% set x = 'x' * (50000000 + i) %}\n{{ '' }}{% endfor %}";
    let limit = std::time::Duration::from_secs(1);
    let template = ChatTemplate::new(source, "", "")
        .unwrap()
        .with_time_limit(limit);
    let started = std::time::Instant::now();
    let err = template.render(&[], false).unwrap_err().to_string();
    assert!(
        err.contains("line 2: ran past 1 s (does it loop forever?)"),
        "{err}"
    );
    assert!(started.elapsed() < limit * 10, "{:?}", started.elapsed());
    assert_eq!(mlxcel_model::MAX_RENDER_TIME.as_secs(), 60);
}

/// Endless recursion stops at the render's recursion bound, well within a 2 MiB thread stack
/// (a server's worker thread), for macros and recursive loops alike.
#[test]
fn endless_recursion_stays_within_a_small_stack() {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            for source in [
                "{% macro again(n) %}{{ again(n + 1) }}{% endmacro %}{{ again(0) }}",
                "{% macro again(n) %}{% for m in messages %}{{ again(n ~ m) }}{% endfor %}{% endmacro %}{{ again('') }}",
                "{% set t = [[1]] %}{% for x in t recursive %}{{ loop(t) }}{% endfor %}",
            ] {
                let err = outcome(source, serde_json::json!({"messages": [1]})).unwrap_err();
                assert!(err.contains("recursion limit exceeded"), "{source}: {err}");
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn errors_name_the_file_the_template_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "{{ bos_token }}\n{{ raise_exception('no ' ~ messages | length) }}";
    let config = serde_json::json!({"bos_token": "<s>", "chat_template": bad});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let err = ChatTemplate::from_dir(dir.path())
        .unwrap()
        .unwrap()
        .render(&[], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json `chat_template`: line 2: no 0"),
        "{err}"
    );
    std::fs::write(dir.path().join("chat_template.jinja"), "\n\n{% if %}").unwrap();
    let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("chat_template.jinja: does not compile: line 3:"),
        "{err}"
    );
}

#[test]
fn render_with_fills_in_what_hugging_face_passes() {
    let source = "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ bos_token }}{{ eos_token }} {{ extra }}";
    let rendered = outcome(source, serde_json::json!({"messages": [], "extra": 1}));
    assert_eq!(rendered.unwrap(), "True True False <s></s> 1");
    let overridden = outcome(
        source,
        serde_json::json!({"messages": [], "bos_token": "[B]"}),
    );
    assert_eq!(overridden.unwrap(), "True True False [B]</s> ");
    let err = outcome(source, serde_json::json!({"tools": []})).unwrap_err();
    assert!(err.contains("`messages`"), "{err}");
    let t = ChatTemplate::new(SMOLLM2_TEMPLATE, "", "").unwrap();
    assert_eq!(
        t.render(&[user("Hi")], true).unwrap(),
        t.render_with(&serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true}))
            .unwrap()
    );
}

#[test]
fn strftime_now_reads_the_local_clock_unless_pinned() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i32 = t.render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2025, "{year}");
    let pinned = t.with_fixed_now("1999-12-31T23:59:59").unwrap();
    assert_eq!(pinned.render(&[], false).unwrap(), "1999");
    let err = ChatTemplate::new("", "", "")
        .unwrap()
        .with_fixed_now("yesterday")
        .unwrap_err();
    assert!(err.to_string().contains("yesterday"), "{err}");
}

/// Found by the `chat_template` fuzz target: in `{%}` the `%` of `{%` was taken for the one of
/// `%}`, and the `{% generation %}` rewrite sliced the tag backwards (a panic). Now it is a
/// syntax error like any other, and the tags after it are still rewritten.
#[test]
fn a_tag_whose_percent_signs_overlap_is_a_syntax_error() {
    for source in ["{%}", "a{%}b", "{%} {% generation %}x{% endgeneration %}"] {
        let err = ChatTemplate::new(source, "", "").unwrap_err().to_string();
        assert!(err.contains("does not compile"), "{source}: {err}");
    }
    let rendered = outcome(
        "{% generation %}x{% endgeneration %}{{ '{%}' }}",
        serde_json::json!({"messages": []}),
    );
    assert_eq!(rendered.unwrap(), "x{%}");
}

/// docs/model.md's list of what differs from jinja2, held both ways: each expression with
/// jinja2 3.1.6's output (rendered as Hugging Face renders) and mlxcel's, so that a change of the
/// renderer shows up here and in the list together. The first group was on the list with
/// minijinja 2 and renders as jinja2 since minijinja 3.
#[test]
fn the_documented_differences_from_jinja2_hold() {
    let render = |expr: &str| {
        outcome(
            &format!("{{{{ {expr} }}}}"),
            serde_json::json!({"messages": []}),
        )
        .unwrap_or_else(|e| format!("error: {e}"))
    };
    for (expr, jinja2) in [
        ("(1, 2)", "(1, 2)"),
        ("(1,)", "(1,)"),
        ("()", "()"),
        ("(1, 2) == [1, 2]", "False"),
        ("[(1, 2)] | tojson", "[[1, 2]]"),
        ("{'b': 1, 'a': 2} | dictsort", "[('a', 2), ('b', 1)]"),
        ("{'a': 1}.items() | list", "[('a', 1)]"),
        ("'a' ~ [1, 'b']", "a[1, 'b']"),
        ("'a' ~ (1, 'b')", "a(1, 'b')"),
        ("'ab' * -1", ""),
        ("[{'a': 1}, {'a': 2}] | min(attribute='a')", "{'a': 1}"),
    ] {
        assert_eq!(render(expr), jinja2, "{expr}");
    }
    for (expr, ours, jinja2) in [
        ("'a' ~ 1e16", "a10000000000000000.0", "a1e+16"),
        ("'a' ~ 0.00001", "a0.00001", "a1e-05"),
        ("'%s' % 1", "error: ", "1"),
        ("'a b' | wordcount", "error: ", "2"),
        ("'a' | center(5)", "error: ", "  a  "),
        ("'abcdef' | truncate(5)", "error: ", "abcdef"),
        ("100 | filesizeformat", "error: ", "100 Bytes"),
        ("'a b' | urlencode", "error: ", "a%20b"),
        ("{'a': 1}.items is defined", "False", "True"),
        ("namespace(a=1)", "{'a': 1}", "<Namespace {'a': 1}>"),
        (
            "range(3) | tojson",
            "[0, 1, 2]",
            "error: (TypeError: range)",
        ),
    ] {
        let got = render(expr);
        assert!(
            got.starts_with(ours) && (!ours.is_empty() || got.is_empty()),
            "{expr}: {got} (jinja2: {jinja2})"
        );
        assert_ne!(
            got, jinja2,
            "{expr} now renders as jinja2: update docs/model.md"
        );
    }
}
