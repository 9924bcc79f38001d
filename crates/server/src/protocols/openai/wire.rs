//! OpenAI's request bodies (`/v1/completions`, `/v1/chat/completions`) and their translation into
//! the one request ([`Generation`]). The sampling fields are not declared here: they are read
//! from the same body in the engine's one declaration and checked against OpenAI's ranges
//! ([`crate::read::GenerationBody`]), then passed on as they are.

use mlxcel_engine::SamplingOverrides;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::prompts::read_prompts;
use crate::read::GenerationBody;
use crate::reasoning::ReasoningFields;
use crate::request::{
    Call, Chat, Continuation, Generation, Params, Prompt, ToolRequest, Turn, budget, function_tool,
};
use crate::structured::{ConstraintFields, ResponseFormat};
use crate::tools::read_tools;

/// Most alternatives per token a request may ask for.
pub(super) const MAX_TOP_LOGPROBS: u32 = 20;

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both OpenAI generation routes share.
#[derive(Debug)]
pub(super) struct Common {
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    n: Option<u32>,
    stop: Option<StopField>,
    constraint: ConstraintFields,
}

/// Declares a request struct with the [`Common`] fields inline (not `#[serde(flatten)]`, which
/// would lose the field name from type errors) and a method that gathers them.
macro_rules! openai_request {
    ($name:ident { $($(#[$attr:meta])* $field:ident: $ty:ty,)* }) => {
        #[derive(Debug, Deserialize)]
        pub(super) struct $name {
            $($(#[$attr])* pub $field: $ty,)*
            pub model: Option<String>,
            #[serde(default)]
            stream: bool,
            stream_options: Option<StreamOptions>,
            max_tokens: Option<i64>,
            n: Option<u32>,
            stop: Option<StopField>,
            // The sampling fields (`temperature`, `top_p`, `seed`, the penalties, and
            // llama-server's `top_k`, `min_p` ...) and `logit_bias` are read beside these
            // (read.rs's `GenerationBody`).
            // Structured output (structured.rs).
            response_format: Option<ResponseFormat>,
            json_schema: Option<Value>,
            grammar: Option<String>,
            guided_json: Option<Value>,
            guided_regex: Option<String>,
            guided_grammar: Option<String>,
        }

        impl $name {
            pub(super) fn common(&mut self) -> Common {
                Common {
                    constraint: ConstraintFields {
                        response_format: self.response_format.take(),
                        json_schema: self.json_schema.take(),
                        grammar: self.grammar.take(),
                        guided_json: self.guided_json.take(),
                        guided_regex: self.guided_regex.take(),
                        guided_grammar: self.guided_grammar.take(),
                    },
                    stream: self.stream,
                    stream_options: self.stream_options.take(),
                    max_tokens: self.max_tokens,
                    n: self.n,
                    stop: self.stop.take(),
                }
            }
        }
    };
}

impl Common {
    /// The sampling and stopping parameters; `max_tokens` is `max_completion_tokens` when the
    /// request gave it.
    pub(super) fn params(
        self,
        max_tokens: Option<i64>,
        logprobs: Option<usize>,
        sampling: SamplingOverrides,
    ) -> Result<Params, ApiError> {
        choices(self.n)?;
        let param = if max_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let max_tokens = max_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            return Err(ApiError::invalid_param(
                param,
                format!("{param}=0: expected at least 1"),
            ));
        }
        Ok(Params {
            max_new_tokens: budget(param, max_tokens)?,
            stop: self.stop.map(StopField::into_vec).unwrap_or_default(),
            logprobs,
            constraint: self.constraint.constraint()?,
            sampling,
            ..Params::default()
        })
    }

    /// The choices asked for (`n`).
    pub(super) fn n(&self) -> usize {
        self.n.map_or(1, |n| n as usize)
    }

    /// Whether a stream ends with a usage chunk.
    pub(super) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

openai_request!(CompletionRequest {
    /// One prompt or a list, in llama-server's forms (`crate::prompts`).
    prompt: Value,
    logprobs: Option<u32>,
    echo: Option<bool>,
    best_of: Option<u32>,
    suffix: Option<String>,
});

openai_request!(ChatRequest {
    messages: Vec<MessageField>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    functions: Option<Vec<Value>>,
    function_call: Option<Value>,
    // Reasoning models (crate::reasoning).
    reasoning_format: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
    reasoning_effort: Option<String>,
    reasoning_budget_tokens: Option<i64>,
    thinking_budget_tokens: Option<i64>,
    // How the prompt ends (crate::request::Continuation).
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<Value>,
});

#[derive(Debug, Deserialize)]
pub(crate) struct MessageField {
    role: String,
    content: Option<ContentField>,
    /// An assistant turn's calls (`id`, `type`, `function: {name, arguments}`).
    tool_calls: Option<Vec<Value>>,
    /// A `tool` turn's answer to this call.
    tool_call_id: Option<String>,
    /// The function's name on a `tool`/`function` turn.
    name: Option<String>,
    /// An assistant turn's reasoning (llama-server's `reasoning_content`), which reasoning
    /// templates render in the turn's thinking block.
    reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// An earlier call as OpenAI writes it (`{id, type, function: {name, arguments}}`), typed.
fn call_of(call: &Value) -> Call {
    let text = |pointer: &str| {
        call.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    Call::new(
        text("/id"),
        text("/function/name"),
        call.pointer("/function/arguments").cloned(),
    )
}

/// The messages as typed turns (text content only), with their tool calls and results and an
/// assistant turn's reasoning.
pub(crate) fn turns(messages: Vec<MessageField>) -> Result<Vec<Turn>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages is empty; send at least one",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ContentField::Text(text)) => text,
                Some(ContentField::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::unsupported(
                                    &format!("messages[{i}].content"),
                                    format!("messages[{i}].content: content parts of type `{kind}` are not supported; send text"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            Ok(Turn {
                role: m.role,
                content,
                tool_calls: m.tool_calls.map(|calls| calls.iter().map(call_of).collect()),
                tool_call_id: m.tool_call_id,
                name: m.name,
                reasoning_content: m.reasoning_content,
            })
        })
        .collect()
}

/// The roles OpenAI's chat completions take (`developer` is the newer name of `system`;
/// `function` is the legacy tool result).
const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Refuses what OpenAI refuses in `messages` and templates would take silently: a role it does not
/// know (it would reach the template as a turn of that name) and a missing (`null`) content on a
/// turn other than the assistant's (which may carry only calls). llama-server's
/// `/apply-template` keeps its looser reading ([`turns`] alone).
fn check_messages(messages: &[MessageField]) -> Result<(), ApiError> {
    for (i, message) in messages.iter().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role: `{}` is not one of {}",
                    message.role,
                    ROLES.join(", ")
                ),
            ));
        }
        if message.content.is_none() && message.role != "assistant" {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].content"),
                format!(
                    "messages[{i}].content: a `{}` message needs content (a string or text parts)",
                    message.role
                ),
            ));
        }
    }
    Ok(())
}

/// What the OpenAI reply needs to know of a request beyond the one request.
pub(super) struct Asked {
    pub logprobs: bool,
    pub include_usage: bool,
    /// Choices per prompt (`n`; `crate::fanout`).
    pub n: usize,
    /// llama-server's `verbose`: the answer carries `__verbose`.
    pub verbose: bool,
}

/// The most choices one request may ask for (`n`): each is a generation of its own.
pub(super) const MAX_CHOICES: u32 = 128;

/// Checks `n`: from 1 to [`MAX_CHOICES`].
fn choices(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        Some(0) => Err(ApiError::invalid_param("n", "n=0: expected at least 1")),
        Some(n) if n > MAX_CHOICES => Err(ApiError::invalid_param(
            "n",
            format!("n={n}: at most {MAX_CHOICES} choices per request"),
        )),
        _ => Ok(()),
    }
}

impl ChatRequest {
    /// The one request, with the body's sampling fields and llama-server's fields applied.
    pub(super) fn into_generation(
        body: GenerationBody<Self>,
    ) -> Result<(Generation, Asked), ApiError> {
        let GenerationBody {
            request: mut this,
            sampling,
            llama,
        } = body;
        let common = this.common();
        let logprobs = match (this.logprobs, this.top_logprobs) {
            (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    format!("top_logprobs={n}: at most {MAX_TOP_LOGPROBS}"),
                ));
            }
            (false, Some(n)) if n > 0 => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "top_logprobs requires logprobs=true",
                ));
            }
            (true, n) => Some(n.unwrap_or(0) as usize),
            // As llama-server: without `logprobs`, its `n_probs` asks for them.
            (false, _) => llama.n_probs.filter(|&n| n > 0),
        };
        let raw_tools = this.tools.take().filter(|t| !t.is_empty());
        let (tools, choice) = read_tools(
            raw_tools.clone(),
            this.tool_choice.take(),
            this.functions.take(),
            this.function_call.take(),
        )?;
        // Tools as the request gave them (legacy functions in the tools shape).
        let listed: Vec<Value> = raw_tools.unwrap_or_else(|| {
            tools
                .iter()
                .map(|t| function_tool(&t.name, None, Some(&t.parameters)))
                .collect()
        });
        check_messages(&this.messages)?;
        let turns = turns(std::mem::take(&mut this.messages))?;
        let stream = common.stream;
        let n = common.n();
        let include_usage = common.include_usage();
        let mut params = common.params(this.max_completion_tokens, logprobs, sampling)?;
        llama.apply(&mut params)?;
        let asked = Asked {
            logprobs: logprobs.is_some(),
            include_usage,
            n,
            verbose: params.verbose,
        };
        let tools = ToolRequest {
            listed,
            tools,
            choice,
            parallel: this.parallel_tool_calls.unwrap_or(true),
            other_constraint: "response_format (or another output constraint)",
        };
        let reasoning = ReasoningFields {
            reasoning_format: this.reasoning_format.take(),
            chat_template_kwargs: this.chat_template_kwargs.take(),
            reasoning_effort: this.reasoning_effort.take(),
            reasoning_budget_tokens: this.reasoning_budget_tokens,
            thinking_budget_tokens: this.thinking_budget_tokens,
        };
        reasoning.check()?;
        let continuation = Continuation::from_fields(
            this.add_generation_prompt,
            this.continue_final_message.as_ref(),
        )?;
        let generation = Generation {
            prompt: Prompt::Chat(Chat {
                turns,
                tools,
                reasoning: Box::new(reasoning),
                continuation,
            }),
            params,
            stream,
        };
        Ok((generation, asked))
    }
}

impl CompletionRequest {
    /// The one request, with the body's sampling fields and llama-server's fields applied.
    pub(super) fn into_generations(
        body: GenerationBody<Self>,
    ) -> Result<(Vec<Generation>, Asked), ApiError> {
        let GenerationBody {
            request: mut this,
            sampling,
            llama,
        } = body;
        let common = this.common();
        if this.echo == Some(true) {
            return Err(ApiError::unsupported("echo", "echo=true is not supported"));
        }
        if let Some(best_of) = this.best_of.filter(|&b| b != 1) {
            return Err(ApiError::unsupported(
                "best_of",
                format!("best_of={best_of} is not supported (1 only)"),
            ));
        }
        if this.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported(
                "suffix",
                "suffix (insertion) is not supported",
            ));
        }
        let logprobs = match this.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!("logprobs={n}: at most {MAX_TOP_LOGPROBS}"),
                ));
            }
            other => other.map(|n| n as usize),
        };
        // llama-server's `n_probs` wins over `logprobs` (its alias there) when given.
        let logprobs = match llama.n_probs {
            Some(n) => (n > 0).then_some(n),
            None => logprobs,
        };
        let prompts = read_prompts("prompt", &this.prompt)?;
        let stream = common.stream;
        let n = common.n();
        let include_usage = common.include_usage();
        let mut params = common.params(None, logprobs, sampling)?;
        llama.apply(&mut params)?;
        let asked = Asked {
            logprobs: logprobs.is_some(),
            include_usage,
            n,
            verbose: params.verbose,
        };
        let generations = prompts
            .into_iter()
            .map(|prompt| Generation {
                prompt: Prompt::Input(prompt),
                params: params.clone(),
                stream,
            })
            .collect();
        Ok((generations, asked))
    }
}
