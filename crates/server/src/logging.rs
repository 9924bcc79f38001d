//! Where the log goes and in what form: stderr, under `RUST_LOG` or a default filter, as text
//! lines (tracing's format) or, with `--log-format json`, one JSON object per line
//! (`timestamp`, `level`, `target`, `message` and the event's fields), for log collectors.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// tracing's text lines: time, level, target, message, `key=value` fields.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A subscriber writing to `writer` under `filter` (tracing's filter syntax, e.g. `info` or
/// `warn,mlxcel_server=info`) in `format`; `timestamps` off gives short text lines (level and
/// message only). Tests capture the server's log with it.
pub fn log_subscriber<W>(
    filter: &str,
    format: LogFormat,
    timestamps: bool,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(writer);
    match (format, timestamps) {
        (LogFormat::Json, _) => Box::new(builder.event_format(JsonLines).finish()),
        (LogFormat::Text, true) => Box::new(builder.finish()),
        (LogFormat::Text, false) => Box::new(builder.without_time().with_target(false).finish()),
    }
}

/// Logs to stderr: `info` by default, `debug` when `verbose`; `RUST_LOG` (tracing's filter syntax,
/// e.g. `RUST_LOG=mlxcel_engine=debug`) replaces either.
pub fn init_logging(verbose: bool) {
    init_logging_as(if verbose { "debug" } else { "info" }, LogFormat::Text);
}

/// Logs to stderr under `RUST_LOG` when it is set, else under `default` (a filter such as
/// `warn,mlxcel_xla=info`); `timestamps` off gives short lines for a terminal session (level and
/// message only). The command-line tools call this once, first thing, so that `RUST_LOG` works in
/// every subcommand. A second call does nothing.
pub fn init_logging_with(default: &str, timestamps: bool) {
    init(default, LogFormat::Text, timestamps);
}

/// As [`init_logging_with`] with timestamps, in `format`.
pub fn init_logging_as(default: &str, format: LogFormat) {
    init(default, format, true);
}

/// As [`init_logging_as`], on stdout instead of stderr with `stdout` (llama-server's
/// `--log-jsonl`), and writing each line to `file` too (`--log-file`).
pub fn init_logging_to(
    default: &str,
    format: LogFormat,
    stdout: bool,
    file: Option<std::fs::File>,
) {
    let writer = match (stdout, file) {
        (false, None) => BoxMakeWriter::new(std::io::stderr),
        (false, Some(file)) => tee_writer(file),
        (true, None) => BoxMakeWriter::new(std::io::stdout),
        (true, Some(file)) => BoxMakeWriter::new(std::io::stdout.and(std::sync::Mutex::new(file))),
    };
    install(default, format, true, writer);
}

/// Opens a log file for appending, created if missing (`--log-file`).
pub fn open_log_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// A writer that writes every line to stderr and to `file`.
pub fn tee_writer(file: std::fs::File) -> BoxMakeWriter {
    BoxMakeWriter::new(std::io::stderr.and(std::sync::Mutex::new(file)))
}

fn init(default: &str, format: LogFormat, timestamps: bool) {
    install(
        default,
        format,
        timestamps,
        BoxMakeWriter::new(std::io::stderr),
    );
}

fn install(default: &str, format: LogFormat, timestamps: bool, writer: BoxMakeWriter) {
    // A `RUST_LOG` tracing cannot read is passed over for the default, as before.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|f| tracing_subscriber::EnvFilter::try_new(f).is_ok())
        .unwrap_or_else(|| default.to_owned());
    let _ = tracing::subscriber::set_global_default(log_subscriber(
        &filter, format, timestamps, writer,
    ));
}

/// The JSON-lines event format.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(time));
        line.insert("level".into(), Value::String(metadata.level().to_string()));
        line.insert("target".into(), Value::String(metadata.target().to_owned()));
        let mut fields = JsonFields(line);
        event.record(&mut fields);
        writeln!(writer, "{}", Value::Object(fields.0))
    }
}

/// An event's fields as JSON values: numbers and booleans as themselves, the rest as text.
struct JsonFields(Map<String, Value>);

impl Visit for JsonFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number);
        self.0.insert(field.name().to_owned(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_level_message_and_typed_fields() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = log_subscriber("info", LogFormat::Json, true, move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                status = 200_u16,
                tok_s = 12.5,
                route = "/x",
                ok = true,
                "request"
            );
            tracing::debug!("filtered out");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "request");
        assert_eq!(line["status"], 200);
        assert_eq!(line["tok_s"], 12.5);
        assert_eq!(line["route"], "/x");
        assert_eq!(line["ok"], true);
        assert!(line["timestamp"].as_str().unwrap().contains('T'), "{line}");
    }
}
