//! The interactive chat: turns read from standard input, the conversation kept, and its
//! commands (`/help`, `/clear`, `/save FILE`, `/load FILE`, `/bye`).
//!
//! Each turn renders the whole conversation through the chat template, but the engine keeps the
//! conversation's KV between turns (its prefix cache, which the chat turns on): a turn's prompt
//! starts with the previous prompt and its answer, token for token where the template renders an
//! answer as it was generated, so only the new turn is prefilled. The statistics line says how
//! many tokens were reused; where the template renders the conversation differently from how it
//! ran (a template that drops earlier reasoning, say) the chat says how many tokens that costs.

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use mlxcel_engine::ChatMessage;

use super::answer::Session;
use super::conversation;

/// ANSI colours of `--color`.
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

/// What `/help` prints.
const HELP: &str = "\
commands:
  /help        this list
  /clear       forget the conversation (the system message stays)
  /save FILE   write the conversation to FILE (JSON: its messages)
  /load FILE   read a conversation /save wrote, and prefill it
  /bye         leave (as end of input does)
a line ending in \\ continues on the next; a message that begins with / is sent as //TEXT";

/// A line of input: a command, or a message for the model.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Message(&'a str),
    Command(Command<'a>),
    Bye,
}

/// A command that leaves the chat running.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    Help,
    Clear,
    Save(&'a Path),
    Load(&'a Path),
}

/// Reads one turn's input. `//TEXT` is the message `/TEXT`; any other line that begins with `/`
/// is a command, and one that is not known is refused naming it (never sent to the model).
fn parse(line: &str) -> Result<Input<'_>> {
    let trimmed = line.trim();
    if let Some(escaped) = trimmed.strip_prefix("//") {
        return Ok(Input::Message(
            &trimmed[trimmed.len() - escaped.len() - 1..],
        ));
    }
    let Some(command) = trimmed.strip_prefix('/') else {
        return Ok(Input::Message(line));
    };
    let (name, argument) = match command.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (command, ""),
    };
    let file = |verb: &str| {
        if argument.is_empty() {
            bail!("/{verb} needs a file: /{verb} FILE");
        }
        Ok(Path::new(argument))
    };
    let bare = |input: Input<'static>| {
        if argument.is_empty() {
            Ok(input)
        } else {
            bail!("/{name} takes no argument (got \"{argument}\")")
        }
    };
    match name {
        "help" | "?" => bare(Input::Command(Command::Help)),
        "clear" => bare(Input::Command(Command::Clear)),
        "bye" => bare(Input::Bye),
        "save" => Ok(Input::Command(Command::Save(file("save")?))),
        "load" => Ok(Input::Command(Command::Load(file("load")?))),
        _ => bail!(
            "unknown command /{name} (not sent to the model); /help lists the commands, and \
             //{command} sends the line as a message"
        ),
    }
}

/// The conversation, and what the engine holds of it.
struct Chat<'s, 'a> {
    session: &'s Session<'a>,
    history: Vec<ChatMessage>,
    /// The tokens whose KV the engine computed for the last request (its prompt and answer but
    /// the answer's last token, which nothing read back): what the next prompt should start with.
    held: Vec<u32>,
}

/// An interactive chat: history kept, commands read (`/help`), `/bye` or end of input leaves,
/// and a line ending in `\` continues on the next line. `first` is answered before any line is
/// read; `single_turn` leaves after one answer.
pub fn chat(session: &Session<'_>, first: Option<String>, single_turn: bool) -> Result<()> {
    if !session.options.chat_template() {
        bail!(
            "interactive chat needs the chat template; give a prompt with -p instead (or drop \
             --no-chat-template)"
        );
    }
    if !single_turn {
        eprintln!("chat: /help lists the commands, /bye leaves; end a line with \\ to continue it");
    }
    let mut chat = Chat {
        session,
        history: session.system_messages(),
        held: Vec::new(),
    };
    if let Some(first) = first {
        let answered = chat.turn(&first);
        if single_turn {
            return answered;
        }
        if let Err(err) = answered {
            eprintln!("error: {err:#}");
        }
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        if session.colour {
            eprint!("{GREEN}");
        }
        let input = read_turn(&mut lines);
        if session.colour {
            eprint!("{RESET}");
        }
        let Some(input) = input? else {
            return Ok(());
        };
        if input.trim().is_empty() {
            continue;
        }
        let done = match parse(&input) {
            Ok(Input::Bye) => return Ok(()),
            Ok(Input::Message(message)) => {
                let answered = chat.turn(message);
                if single_turn {
                    return answered;
                }
                answered
            }
            Ok(Input::Command(command)) => chat.command(command),
            Err(err) => Err(err),
        };
        if let Err(err) = done {
            eprintln!("error: {err:#}");
        }
    }
}

impl Chat<'_, '_> {
    /// Answers `input` after the conversation, which keeps the turn if it was answered; a refused
    /// turn (too long, say) leaves the conversation as it was.
    fn turn(&mut self, input: &str) -> Result<()> {
        self.history.push(ChatMessage::new("user", input));
        let rendering = Instant::now();
        let answered = self
            .session
            .prompt_ids(input, &self.history)
            .and_then(|prompt| {
                let rendered = rendering.elapsed();
                self.note_rerendering(&prompt);
                let answer = self.session.generate(prompt.clone(), Some(rendered))?;
                Ok((prompt, answer))
            });
        match answered {
            Ok((prompt, answer)) => {
                // With the cache off the engine keeps nothing, so nothing is compared.
                if self.session.reuses_prefixes {
                    let computed = answer.tokens.len().saturating_sub(1);
                    self.held = prompt;
                    self.held.extend_from_slice(&answer.tokens[..computed]);
                }
                self.history
                    .push(ChatMessage::new("assistant", answer.text.trim()));
                Ok(())
            }
            Err(err) => {
                self.history.pop();
                Err(err)
            }
        }
    }

    /// Says so when `prompt` does not start with every token the engine holds of the
    /// conversation: the template rendered an earlier turn otherwise than it ran (a reply cut by
    /// a stop string, or a template that drops earlier reasoning), so those tokens are
    /// prefilled again.
    fn note_rerendering(&self, prompt: &[u32]) {
        let common = self
            .held
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let lost = self.held.len() - common;
        if lost > 0 {
            self.session.stats(&format!(
                "(the template renders the conversation so far differently from how it ran, from \
                 token {common} of {}: those {lost} tokens are prefilled again)",
                self.held.len()
            ));
        }
    }

    fn command(&mut self, command: Command<'_>) -> Result<()> {
        match command {
            Command::Help => eprintln!("{HELP}"),
            Command::Clear => {
                self.history = self.session.system_messages();
                self.held.clear();
                eprintln!("(conversation cleared)");
            }
            Command::Save(path) => {
                conversation::save(path, &self.history)?;
                eprintln!(
                    "(saved {} messages to {})",
                    self.history.len(),
                    path.display()
                );
            }
            Command::Load(path) => self.load(path)?,
        }
        Ok(())
    }

    /// Replaces the conversation with the one saved in `path` (its system message included) and
    /// prefills it, so that the next turn prefills only itself.
    fn load(&mut self, path: &Path) -> Result<()> {
        let messages = conversation::load(path)?;
        if messages.is_empty() {
            self.history = self.session.system_messages();
            self.held.clear();
            eprintln!("(loaded an empty conversation from {})", path.display());
            return Ok(());
        }
        if !self.session.reuses_prefixes {
            // Nothing would keep the prefilled KV: the next turn prefills the whole of it.
            eprintln!(
                "(loaded {} messages from {}; with --cache-ram 0 each turn prefills all of them)",
                messages.len(),
                path.display()
            );
            self.history = messages;
            self.held.clear();
            return Ok(());
        }
        let tokens = self.session.conversation_ids(&messages)?;
        let prefilled = self.session.prefill(tokens.clone())?;
        eprintln!(
            "(loaded {} messages from {})",
            messages.len(),
            path.display()
        );
        self.session.stats(&format!(
            "prompt: {} tokens, prefill {} new tokens ({} reused) in {:.3}s = {:.1} tok/s",
            prefilled.tokens,
            prefilled.tokens - prefilled.reused,
            prefilled.reused,
            prefilled.time.as_secs_f64(),
            super::answer::rate(
                prefilled.tokens - prefilled.reused,
                prefilled.time.as_secs_f64()
            )
        ));
        self.history = messages;
        self.held = tokens;
        Ok(())
    }
}

/// One turn from standard input (lines ending in `\` continue it); `None` at end of input.
fn read_turn(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Result<Option<String>> {
    let mut input = String::new();
    loop {
        let Some(line) = lines.next() else {
            return Ok(None);
        };
        let line = line?;
        match line.strip_suffix('\\') {
            Some(continued) => {
                input.push_str(continued);
                input.push('\n');
            }
            None => {
                input.push_str(&line);
                return Ok(Some(input));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_messages_or_commands() {
        assert_eq!(parse("Hello").unwrap(), Input::Message("Hello"));
        assert_eq!(parse(" /help ").unwrap(), Input::Command(Command::Help));
        assert_eq!(parse("/?").unwrap(), Input::Command(Command::Help));
        assert_eq!(parse("/clear").unwrap(), Input::Command(Command::Clear));
        assert_eq!(parse("/bye").unwrap(), Input::Bye);
        assert_eq!(
            parse("/save my chat.json ").unwrap(),
            Input::Command(Command::Save(Path::new("my chat.json")))
        );
        assert_eq!(
            parse("/load a.json").unwrap(),
            Input::Command(Command::Load(Path::new("a.json")))
        );
        // `//` escapes a message that begins with a slash.
        assert_eq!(
            parse("//usr/bin is where?").unwrap(),
            Input::Message("/usr/bin is where?")
        );
    }

    #[test]
    fn bad_commands_are_refused_by_name() {
        let error = |line: &str| format!("{:#}", parse(line).unwrap_err());
        assert!(error("/sav x").contains("unknown command /sav (not sent to the model)"));
        assert!(error("/usr/bin").contains("//usr/bin sends the line"));
        assert!(error("/save").contains("/save needs a file"));
        assert!(error("/load   ").contains("/load needs a file"));
        assert!(error("/clear all").contains("/clear takes no argument"));
    }
}
