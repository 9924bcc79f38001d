//! The splitter on replies cut into pieces at every place, with and without markers.

use super::*;

/// Feeds `pieces` one at a time and returns the concatenated split.
fn streamed(format: ReasoningFormat, form: Form, pieces: &[&str]) -> Split {
    let mut splitter = Splitter::new(format, form).expect("a splitting format");
    let mut all = Split::default();
    for piece in pieces {
        all.extend(splitter.push(piece));
    }
    all.extend(splitter.finish());
    all
}

/// `text` split whole, and split after cutting it into pieces of every size from 1 byte up:
/// every cut gives the same split.
fn every_cut(format: ReasoningFormat, form: Form, text: &str) -> Split {
    let whole = streamed(format, form, &[text]);
    let chars: Vec<char> = text.chars().collect();
    for size in 1..=chars.len().max(1) {
        let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            streamed(format, form, &pieces),
            whole,
            "cut into pieces of {size}"
        );
    }
    whole
}

const THINK: Form = Form::Think { open: false };
const OPEN: Form = Form::Think { open: true };

fn split(reasoning: &str, content: &str) -> Split {
    Split {
        reasoning: reasoning.into(),
        content: content.into(),
        calls: Vec::new(),
    }
}

#[test]
fn think_tags_split_the_reply_wherever_they_are_cut() {
    let text = "<think>\nLet me add: 2 + 2.\n</think>\n\nThe answer is 4.";
    assert_eq!(
        every_cut(ReasoningFormat::Auto, THINK, text),
        split("Let me add: 2 + 2.", "The answer is 4.")
    );
    assert_eq!(
        every_cut(ReasoningFormat::Deepseek, THINK, text),
        split("Let me add: 2 + 2.", "The answer is 4.")
    );
}

#[test]
fn a_reply_without_markers_is_all_answer() {
    let text = "  Hello, <b>world</b> < think";
    assert_eq!(
        every_cut(ReasoningFormat::Auto, THINK, text),
        split("", text)
    );
    // A cut `<think>` that never completes is the answer's text.
    assert_eq!(
        every_cut(ReasoningFormat::Auto, THINK, "<thi"),
        split("", "<thi")
    );
}

#[test]
fn a_prompt_that_opened_the_block_starts_the_reply_as_reasoning() {
    let text = "I should greet.\n</think>\n\nHi!";
    assert_eq!(
        every_cut(ReasoningFormat::Auto, OPEN, text),
        split("I should greet.", "Hi!")
    );
    assert_eq!(
        Form::of("{{ x }}", "<|im_start|>assistant\n<think>\n"),
        OPEN
    );
    assert_eq!(Form::of("{{ x }}", "<|im_start|>assistant\n"), THINK);
}

#[test]
fn unterminated_thinking_is_all_reasoning() {
    assert_eq!(
        every_cut(ReasoningFormat::Auto, THINK, "<think>still going </"),
        split("still going </", "")
    );
    assert_eq!(
        every_cut(ReasoningFormat::Auto, OPEN, "cut by the budget  "),
        split("cut by the budget", "")
    );
}

#[test]
fn legacy_keeps_the_whole_reply_as_content_and_none_splits_nothing() {
    let text = "<think>why</think>because";
    assert_eq!(
        every_cut(ReasoningFormat::DeepseekLegacy, THINK, text),
        split("why", text)
    );
    assert!(Splitter::new(ReasoningFormat::None, THINK).is_none());
}

#[test]
fn harmony_channels_split_into_reasoning_and_answer() {
    let text = "<|channel|>analysis<|message|>User greets. Reply.<|end|>\
                <|start|>assistant<|channel|>final<|message|>Hello there!<|return|>";
    assert_eq!(
        every_cut(ReasoningFormat::Auto, Form::Harmony, text),
        split("User greets. Reply.", "Hello there!")
    );
    // A reply cut inside the analysis: reasoning only.
    assert_eq!(
        every_cut(
            ReasoningFormat::Auto,
            Form::Harmony,
            "<|channel|>analysis<|message|>Thinking <"
        ),
        split("Thinking <", "")
    );
    // Not in the harmony form at all: the answer.
    assert_eq!(
        every_cut(ReasoningFormat::Auto, Form::Harmony, "plain text"),
        split("", "plain text")
    );
    // A commentary preamble is the answer's text.
    let preamble = "<|channel|>commentary<|message|>Checking.<|end|>";
    assert_eq!(
        every_cut(ReasoningFormat::Auto, Form::Harmony, preamble),
        split("", "Checking.")
    );
    assert_eq!(Form::of("{{ '<|channel|>' }}", ""), Form::Harmony);
}

#[test]
fn harmony_function_messages_are_tool_calls() {
    let call = |name: &str, arguments: &str| SplitCall {
        name: name.into(),
        arguments: arguments.into(),
    };
    // The recipient after the channel, with a `<|constrain|>` and the `<|call|>` end.
    let text = "<|channel|>analysis<|message|>Need weather.<|end|>\
                <|start|>assistant<|channel|>commentary to=functions.get_weather \
                <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let mut expected = split("Need weather.", "");
    expected
        .calls
        .push(call("get_weather", r#"{"city": "Paris"}"#));
    assert_eq!(
        every_cut(ReasoningFormat::Auto, Form::Harmony, text),
        expected
    );
    // The recipient before the channel, a preamble before it, and the reply ending at the call
    // (`<|call|>` left out of the text as an end-of-generation token).
    let text = "<|channel|>commentary<|message|>Looking it up.<|end|>\
                <|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}";
    let mut expected = split("", "Looking it up.");
    expected.calls.push(call("lookup", r#"{"q": 1}"#));
    assert_eq!(
        every_cut(ReasoningFormat::Auto, Form::Harmony, text),
        expected
    );
    // Two calls in one reply keep their order.
    let text = "<|channel|>commentary to=functions.a<|message|>{}<|call|>\
                <|start|>assistant<|channel|>commentary to=functions.b<|message|>{\"x\": 2}<|call|>";
    let got = every_cut(ReasoningFormat::Auto, Form::Harmony, text);
    assert_eq!(got.calls, vec![call("a", "{}"), call("b", r#"{"x": 2}"#)]);
    assert_eq!(got.content, "");
}

#[test]
fn formats_are_parsed_by_llama_server_names() {
    for name in ReasoningFormat::NAMES {
        assert!(ReasoningFormat::parse("reasoning_format", name).is_ok());
    }
    let err = ReasoningFormat::parse("reasoning_format", "r1").unwrap_err();
    assert!(format!("{err:?}").contains("reasoning_format"), "{err:?}");
}

#[test]
fn budgets_and_kwargs_become_template_variables() {
    let defaults = ReasoningDefaults::new();
    let fields = |json: serde_json::Value| -> ReasoningFields {
        serde_json::from_value(json).expect("fields")
    };
    let off = fields(serde_json::json!({"reasoning_budget_tokens": 0}))
        .resolve(&defaults)
        .unwrap();
    assert_eq!(off.variables["enable_thinking"], false);
    assert!(off.close_thinking);
    // The request's own `enable_thinking` wins over the budget.
    let kwargs = fields(serde_json::json!({
        "thinking_budget_tokens": 0,
        "chat_template_kwargs": {"enable_thinking": true, "custom": 1},
        "reasoning_effort": "high",
    }))
    .resolve(&defaults)
    .unwrap();
    assert_eq!(kwargs.variables["enable_thinking"], true);
    assert_eq!(kwargs.variables["custom"], 1);
    assert_eq!(kwargs.variables["reasoning_effort"], "high");
    assert!(!kwargs.close_thinking);
    // A positive budget keeps thinking on and becomes the reply's budget (the engine ends the
    // block after it, budget.rs); a negative one other than -1 is refused, naming the field.
    let budget = fields(serde_json::json!({"reasoning_budget_tokens": 100}))
        .resolve(&defaults)
        .unwrap();
    assert_eq!(budget.budget_tokens, Some(100));
    assert!(!budget.variables.contains_key("enable_thinking"));
    let err = fields(serde_json::json!({"reasoning_budget_tokens": -3}))
        .check()
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("reasoning_budget_tokens"),
        "{err:?}"
    );
    // The server's kwargs apply under the request's.
    let mut server = ReasoningDefaults::new();
    server
        .template_kwargs
        .insert("enable_thinking".into(), false.into());
    let plain = ReasoningFields::default().resolve(&server).unwrap();
    assert_eq!(plain.variables["enable_thinking"], false);
    assert_eq!(plain.format, ReasoningFormat::Auto);
}

#[test]
fn kwargs_reach_a_qwen3_style_template() {
    let template = mlxcel_model::ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n\
         {% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n\
         {% endif %}{% endif %}",
        "",
        "<|im_end|>",
    )
    .expect("template");
    let turns = [crate::request::Turn::text("user", "hi")];
    let render = |json: serde_json::Value| {
        let options = serde_json::from_value::<ReasoningFields>(json)
            .unwrap()
            .resolve(&ReasoningDefaults::new())
            .unwrap();
        template
            .render_with(&crate::chat::template_context(
                &turns,
                Vec::new(),
                &options.variables,
            ))
            .unwrap()
    };
    let thinking = render(serde_json::json!({}));
    assert!(thinking.ends_with("<|im_start|>assistant\n"), "{thinking}");
    let off = render(serde_json::json!({"chat_template_kwargs": {"enable_thinking": false}}));
    assert!(off.ends_with("<think>\n\n</think>\n\n"), "{off}");
    let budget = render(serde_json::json!({"reasoning_budget_tokens": 0}));
    assert_eq!(budget, off);
}
