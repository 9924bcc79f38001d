//! The one handler every generating route runs. A protocol parses its JSON into a
//! [`Generation`] and names its [`Reply`]; the handler renders the conversation through the chat
//! template, plans the tools (a required call constrains the output; calls are parsed out of the
//! reply), submits (admission and sizing in [`crate::generate::submit`]), then streams the events
//! in the protocol's [`StreamFormat`] or collects them into its whole body.

use std::sync::Arc;

use hyper::Response;
use mlxcel_engine::Engine;

use crate::body::{Body, event_stream};
use crate::chat::{self, ToolPlan};
use crate::error::ApiError;
use crate::generate::{Outcome, StreamFormat, Tracked, collect, stream, submit, tokenize};
use crate::reasoning::{
    Form, ReasoningDefaults, ReasoningFields, ReasoningPlan, TemplateOptions, chat_budget,
    completion_budget,
};
use crate::request::{Chat, Continuation, Generation, Params, Prompt, PromptInput, Turn};
use crate::state::AppState;
use crate::tools::ToolFormat;

/// What the handler learned while preparing a request that its reply needs.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// The format tool calls are looked for in (`None` without tools or with the choice
    /// `none`).
    pub tools: Option<ToolFormat>,
    /// How a chat's reply splits into reasoning and answer (`None` for a prompt given as is).
    pub reasoning: Option<ReasoningPlan>,
    /// The prompt as text (the chat template's output on a chat; empty for token ids), as
    /// llama-server's `verbose` reports it.
    pub prompt: String,
}

/// How one protocol answers a request: as a stream of its events, or as one body.
pub(crate) trait Reply: Send + 'static {
    /// The format of the stream.
    type Stream: StreamFormat;

    /// The stream format of a streamed request, once submitted.
    fn stream(self, tracked: &Tracked) -> Self::Stream;

    /// The whole answer of a request that was not streamed.
    fn whole(self, tracked: &Tracked, outcome: Outcome) -> Response<Body>;

    /// The id the reply carries, for a protocol whose requests can be named by it while they
    /// run (`POST /v1/chat/completions/control`).
    fn completion_id(&self) -> Option<&str> {
        None
    }
}

/// Runs `request` and answers it in the [`Reply`] that `reply` builds from what preparing the
/// request learned ([`Prepared`]).
pub(crate) async fn generate<R: Reply>(
    state: &Arc<AppState>,
    engine: &Engine,
    request: Generation,
    reply: impl FnOnce(Prepared) -> R,
) -> Result<Response<Body>, ApiError> {
    let Generation {
        mut prompt,
        mut params,
        stream: streamed,
    } = request;
    if let Prompt::Chat(chat) = &mut prompt {
        chat.continuation.prefill = state.config().prefill_assistant;
    }
    let (prompt, prepared) = prepare(engine, &state.config().reasoning, prompt, &mut params)?;
    if let Some(dir) = &state.config().prompts_log_dir {
        crate::prompt_log::write_prompt(dir, &prompt);
    }
    let reply = reply(prepared);
    let mut tracked = submit(state, prompt, params).await?;
    if let Some(id) = reply.completion_id() {
        tracked.name(id);
    }
    if streamed {
        let (response, sender) = event_stream();
        let format = reply.stream(&tracked);
        tokio::spawn(stream(tracked, sender, format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    Ok(reply.whole(&tracked, outcome))
}

/// The prompt the engine takes, with the tools' constraint set on `params`. A chat is rendered
/// with its reasoning options over the server's `defaults`; thinking switched off closes a
/// thinking block the template left open, as a budget of 0 ends thinking at once.
fn prepare(
    engine: &Engine,
    defaults: &ReasoningDefaults,
    prompt: Prompt,
    params: &mut Params,
) -> Result<(PromptInput, Prepared), ApiError> {
    let chat = match prompt {
        Prompt::Input(input) => {
            params.reasoning_budget = completion_budget(&params.budget_fields)?;
            let prompt = match &input {
                PromptInput::Text(text) | PromptInput::Templated(text) => text.clone(),
                PromptInput::Tokens(_) | PromptInput::Mixed(_) => String::new(),
            };
            let prepared = Prepared {
                tools: None,
                reasoning: None,
                prompt,
            };
            return Ok((input, prepared));
        }
        Prompt::Chat(chat) => chat,
    };
    let (templated, form, options) = render_chat(
        engine,
        defaults,
        &chat.turns,
        chat.continuation,
        chat.tools.listed,
        &chat.reasoning,
    )?;
    params.reasoning_budget = chat_budget(
        &params.budget_fields,
        options.budget_tokens,
        &defaults.budget_message,
        form,
    );
    let reasoning = (!defaults.skip_parsing).then_some(ReasoningPlan {
        format: options.format,
        form,
    });
    let plan = ToolPlan::new(
        engine,
        chat.tools.tools,
        chat.tools.choice,
        chat.tools.parallel,
    );
    plan.constrain(params, "tool_choice", chat.tools.other_constraint)?;
    let prepared = Prepared {
        tools: plan.parsing().filter(|_| !defaults.skip_parsing),
        reasoning,
        prompt: templated.clone(),
    };
    Ok((PromptInput::Templated(templated), prepared))
}

/// The prompt a chat generates from, as llama-server renders it (`/apply-template` answers it):
/// the turns through the template with the request's reasoning options over the server's
/// `defaults`, and the variables llama-server gives every template. A template that reads
/// `enable_thinking` gets it true unless thinking is off (llama-server's `--reasoning auto`
/// and `on`), and `date_string` (`%d %b %Y`) and `datetime` (`%b %d %Y`) are today's date in
/// local time unless the request's `chat_template_kwargs` name them; they are given only to
/// templates that name them, so that others keep the plain context. Thinking switched off
/// closes a thinking block the template left open. Returns the prompt, its form and the
/// options.
pub(crate) fn render_chat(
    engine: &Engine,
    defaults: &ReasoningDefaults,
    turns: &[Turn],
    continuation: Continuation,
    tools: Vec<serde_json::Value>,
    reasoning: &ReasoningFields,
) -> Result<(String, Form, TemplateOptions), ApiError> {
    let options = reasoning.resolve(defaults)?;
    let source = engine.chat_template_source().unwrap_or_default();
    let mut variables = options.variables.clone();
    if source.contains("enable_thinking") {
        variables
            .entry("enable_thinking")
            .or_insert(serde_json::Value::Bool(true));
    }
    for (name, format) in [("date_string", "%d %b %Y"), ("datetime", "%b %d %Y")] {
        if source.contains(name) {
            variables
                .entry(name)
                .or_insert_with(|| mlxcel_model::strftime_now(format).into());
        }
    }
    let mut templated = chat::render_ending(engine, turns, continuation, tools, &variables)?;
    let mut form = Form::of(&source, &templated);
    if options.close_thinking && form == (Form::Think { open: true }) {
        templated.push_str("\n\n</think>\n\n");
        form = Form::Think { open: false };
    }
    Ok((templated, form, options))
}

/// The tokens of the templated prompt a chat would generate from (its usage's input tokens), for
/// the token-counting routes.
pub(crate) async fn count_tokens(
    state: &AppState,
    engine: Arc<Engine>,
    mut chat: Chat,
) -> Result<usize, ApiError> {
    chat.continuation.prefill = state.config().prefill_assistant;
    let (prompt, _, _) = render_chat(
        &engine,
        &state.config().reasoning,
        &chat.turns,
        chat.continuation,
        chat.tools.listed,
        &chat.reasoning,
    )?;
    tokio::task::spawn_blocking(move || {
        tokenize(&engine, PromptInput::Templated(prompt)).map(|t| t.len())
    })
    .await
    .map_err(|err| ApiError::Internal(format!("tokenizing task failed: {err}")))?
}
