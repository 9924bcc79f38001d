//! The built-in tools of `--tools` (llama-server's, same names, schemas, limits and results):
//! read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info.
//! A tool's own failure is a result `{"error": "..."}`; a missing or mistyped required
//! parameter is [`ToolError::Param`] (400), an unusable runtime [`ToolError::Runtime`] (500).

use serde_json::{Value, json};

use super::edit;
use super::glob::path_glob_match;
use super::io::{ListKind, ToolsIo, sv};
use super::process::RunOptions;
use super::runtime::transport_for_call;

/// The names, in llama-server's order.
pub const NAMES: &[&str] = &[
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
];

const READ_FILE_MAX: u64 = 16 * 1024;
const READ_FILE_MAX_BASE64: u64 = 32 * 1024 * 1024;
const FILE_SEARCH_MAX_RESULTS: i64 = 100;
const GREP_MAX_RESULTS: usize = 100;
const EXEC_MAX_OUTPUT: i64 = 16 * 1024;
const EXEC_MAX_TIMEOUT: i64 = 60;
const GET_INFO_MAX_OUTPUT: usize = 4096;
const GET_INFO_TIMEOUT: u64 = 5;

/// Why a call produced no result.
#[derive(Debug)]
pub enum ToolError {
    /// A required parameter is missing or of the wrong type (400).
    Param(String),
    /// The runtime cannot be used (500).
    Runtime(String),
}

/// What the HTTP layer needs to know of one built-in tool.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub display_name: &'static str,
    pub write: bool,
    pub stream: bool,
}

/// The tool's display name, write permission and streaming support.
pub fn meta(name: &str) -> Meta {
    let (display_name, write, stream) = match name {
        "read_file" => ("Read file", false, false),
        "file_glob_search" => ("File search", false, false),
        "grep_search" => ("Grep search", false, false),
        "exec_shell_command" => ("Execute shell command", true, true),
        "write_file" => ("Write file", true, false),
        "edit_file" => ("Edit file", true, false),
        _ => ("Get Runtime Info", false, false),
    };
    Meta {
        display_name,
        write,
        stream,
    }
}

fn function(name: &str, description: &str, parameters: Value) -> Value {
    json!({
        "type": "function",
        "function": { "name": name, "description": description, "parameters": parameters },
    })
}

fn prop(kind: &str, description: &str) -> Value {
    json!({ "type": kind, "description": description })
}

/// The tool's definition (an OpenAI function tool), as `GET /tools` lists it.
pub fn definition(name: &str) -> Value {
    match name {
        "read_file" => function(
            name,
            "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, each line is prefixed with its line number (e.g. \"1\u{2192}...\").",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path to the file"),
                    "start_line": prop("integer", "First line to read, 1-based (default: 1)"),
                    "end_line": prop("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                    "append_loc": prop("boolean", "Prefix each line with its line number"),
                },
                "required": ["path"],
            }),
        ),
        "file_glob_search" => function(
            name,
            "Recursively search for files matching a glob pattern under a directory. Automatically skips files ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. A pattern containing '/' matches the full relative path; unless already anchored with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. Note: directory listings do not apply .gitignore filtering.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Base directory to search in"),
                    "include": prop("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
                    "exclude": prop("string", "Glob pattern for files to exclude"),
                    "type": prop("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
                    "max_depth": prop("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct children only)"),
                    "limit": prop("integer", &format!("Maximum number of results to return, capped at {FILE_SEARCH_MAX_RESULTS} (default {FILE_SEARCH_MAX_RESULTS})")),
                },
                "required": ["path"],
            }),
        ),
        "grep_search" => function(
            name,
            "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless searching a single file, paths relative to the given directory). Automatically skips files ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the basename at any depth; a pattern containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "File or directory to search in"),
                    "pattern": prop("string", "Pattern to search for (regular expression unless literal is true)"),
                    "include": prop("string", "Glob pattern to filter files (default: **)"),
                    "exclude": prop("string", "Glob pattern to exclude files"),
                    "return_line_numbers": prop("boolean", "If true, include line numbers in results"),
                    "literal": prop("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
                    "ignore_case": prop("boolean", "Case-insensitive search (default: false)"),
                    "context_lines": prop("integer", "Number of lines of context to show before and after each match (default: 0)"),
                },
                "required": ["path", "pattern"],
            }),
        ),
        "exec_shell_command" => function(
            name,
            "Execute a shell command and return its output (stdout and stderr combined).",
            json!({
                "type": "object",
                "properties": {
                    "command": prop("string", "Shell command to execute"),
                    "timeout": prop("integer", &format!("Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})")),
                    "max_output_size": prop("integer", &format!("Maximum output size in bytes (default {EXEC_MAX_OUTPUT})")),
                },
                "required": ["command"],
            }),
        ),
        "write_file" => function(
            name,
            "Write content to a file, creating it (including parent directories) if it does not exist. May use with edit_file for more complex edits.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path of the file to write"),
                    "content": prop("string", "Content to write"),
                },
                "required": ["path", "content"],
            }),
        ),
        "edit_file" => function(
            name,
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is matched against the original content, not incrementally. Merge nearby changes into one edit instead of overlapping edits. Use write_file to replace the whole file.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path to the file to edit"),
                    "edits": {
                        "type": "array",
                        "description": "One or more exact text replacements to apply",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": prop("string", "Exact text to find; must be unique in the file and must not overlap with other edits"),
                                "new_text": prop("string", "Text to replace old_text with"),
                            },
                            "required": ["old_text", "new_text"],
                        },
                    },
                },
                "required": ["path", "edits"],
            }),
        ),
        _ => function(
            "get_info",
            "Returns runtime info: the OS name/version and the current working directory",
            json!({ "type": "object", "properties": {} }),
        ),
    }
}

/// A required string parameter.
pub fn req_str(params: &Value, key: &str) -> Result<String, ToolError> {
    match params.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ToolError::Param(format!(
            "parameter \"{key}\" must be a string"
        ))),
        None => Err(ToolError::Param(format!("missing parameter \"{key}\""))),
    }
}

/// An optional parameter; a value of another type counts as absent (as llama-server's
/// `json_value`).
fn opt_i64(params: &Value, key: &str, default: i64) -> i64 {
    params.get(key).and_then(Value::as_i64).unwrap_or(default)
}
fn opt_bool(params: &Value, key: &str, default: bool) -> bool {
    params.get(key).and_then(Value::as_bool).unwrap_or(default)
}
fn opt_str(params: &Value, key: &str, default: &str) -> String {
    params
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_owned()
}

/// The place a call works in, from its `cwd` and `runtime` (set from the request's headers).
pub fn tools_io(params: &Value) -> Result<ToolsIo, ToolError> {
    let cwd = opt_str(params, "cwd", "");
    let runtime = opt_str(params, "runtime", "");
    let isolate = if runtime.is_empty() {
        None
    } else {
        Some(transport_for_call(&runtime).map_err(ToolError::Runtime)?)
    };
    Ok(ToolsIo { cwd, isolate })
}

fn error(message: String) -> Value {
    json!({ "error": message })
}

/// Runs the built-in tool `name`; `on_chunk` receives `exec_shell_command`'s output as it comes
/// (a streamed call), returning `false` when the client went away.
pub fn invoke(
    name: &str,
    params: &Value,
    on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
) -> Result<Value, ToolError> {
    match name {
        "read_file" => read_file(params),
        "file_glob_search" => file_glob_search(params),
        "grep_search" => grep_search(params),
        "exec_shell_command" => exec_shell_command(params, on_chunk),
        "write_file" => write_file(params),
        "edit_file" => edit_file(params),
        _ => get_info(params),
    }
}

fn read_file(params: &Value) -> Result<Value, ToolError> {
    let path = req_str(params, "path")?;
    let start_line = opt_i64(params, "start_line", 1);
    let end_line = opt_i64(params, "end_line", -1);
    let append_loc = opt_bool(params, "append_loc", false);
    let base64 = opt_str(params, "resp_type", "") == "base64";
    let io = tools_io(params)?;
    let Some(size) = io.file_size(&path) else {
        return Ok(error(format!("cannot stat file: {path}")));
    };
    if base64 {
        if size > READ_FILE_MAX_BASE64 {
            return Ok(error(format!(
                "file too large ({size} bytes, max {READ_FILE_MAX_BASE64})"
            )));
        }
        let Some(content) = io.read_file(&path) else {
            return Ok(error(format!("failed to open file: {path}")));
        };
        return Ok(json!({ "base64": base64_encode(&content), "size_bytes": content.len() }));
    }
    if size > READ_FILE_MAX && end_line == -1 {
        return Ok(error(format!(
            "file too large ({size} bytes, max {READ_FILE_MAX}). Use start_line/end_line to read a portion."
        )));
    }
    let Some(content) = io.read_file(&path) else {
        return Ok(error(format!("failed to open file: {path}")));
    };
    let content = String::from_utf8_lossy(&content);
    let mut result = String::new();
    for (i, line) in lines(&content).enumerate() {
        let lineno = i as i64 + 1;
        if lineno < start_line {
            continue;
        }
        if end_line != -1 && lineno > end_line {
            break;
        }
        let out = if append_loc {
            format!("{lineno}\u{2192}{line}\n")
        } else {
            format!("{line}\n")
        };
        if (result.len() + out.len()) as u64 > READ_FILE_MAX {
            result.push_str("[output truncated]");
            break;
        }
        result.push_str(&out);
    }
    Ok(json!({ "plain_text_response": result }))
}

/// The lines of `text` as C++'s `getline` yields them (no empty last line after a final `\n`).
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let empty = text.is_empty();
    trimmed.split('\n').filter(move |_| !empty)
}

fn file_glob_search(params: &Value) -> Result<Value, ToolError> {
    let io = tools_io(params)?;
    let path = req_str(params, "path")?;
    let base = io.resolve(&path);
    let include = opt_str(params, "include", "**");
    let exclude = opt_str(params, "exclude", "");
    let kind = opt_str(params, "type", "file");
    let max_depth = opt_i64(params, "max_depth", 0).max(0) as usize;
    let limit = opt_i64(params, "limit", FILE_SEARCH_MAX_RESULTS);
    if limit < 1 {
        return Ok(error(format!(
            "invalid limit: {limit} (expected 1 or more)"
        )));
    }
    let limit = limit.min(FILE_SEARCH_MAX_RESULTS) as usize;
    let list_kind = match kind.as_str() {
        "file" => ListKind::Files,
        "dir" => ListKind::Dirs,
        "all" => ListKind::All,
        _ => {
            return Ok(error(format!(
                "invalid type: {kind} (expected \"file\", \"dir\" or \"all\")"
            )));
        }
    };
    let listing = io.list_entries(&base, max_depth, list_kind);
    if let Some(err) = listing.err {
        return Ok(error(format!("{err}: {path}")));
    }
    let matches: Vec<_> = listing
        .entries
        .iter()
        .filter(|e| path_glob_match(&include, &e.rel))
        .filter(|e| exclude.is_empty() || !path_glob_match(&exclude, &e.rel))
        .collect();
    let total = matches.len();
    let shown = total.min(limit);
    let mut text = String::new();
    let mut entries = Vec::new();
    for e in &matches[..shown] {
        text.push_str(&e.rel);
        text.push_str(if e.is_dir { "/\n" } else { "\n" });
        entries.push(json!({ "path": e.rel, "type": if e.is_dir { "dir" } else { "file" } }));
    }
    text.push_str(&format!("\n---\nTotal matches: {total}\n"));
    if total > shown {
        text.push_str(&format!(
            "[{shown} results limit reached ({total} total matches). Refine the glob pattern to narrow the search.]\n"
        ));
    }
    if listing.truncated {
        text.push_str("[results truncated: time budget or unreadable directory]\n");
    }
    Ok(json!({ "plain_text_response": text, "entries": entries, "base": base }))
}

fn grep_search(params: &Value) -> Result<Value, ToolError> {
    let path = req_str(params, "path")?;
    let pattern = req_str(params, "pattern")?;
    let include = opt_str(params, "include", "**");
    let exclude = opt_str(params, "exclude", "");
    let show_lineno = opt_bool(params, "return_line_numbers", false);
    let literal = opt_bool(params, "literal", false);
    let ignore_case = opt_bool(params, "ignore_case", false);
    let ctx = opt_i64(params, "context_lines", 0).max(0) as usize;
    let source = if literal {
        regex::escape(&pattern)
    } else {
        pattern
    };
    let regex = match regex::RegexBuilder::new(&source)
        .case_insensitive(ignore_case)
        .build()
    {
        Ok(r) => r,
        Err(e) => return Ok(error(format!("invalid regex: {e}"))),
    };
    let io = tools_io(params)?;
    let abs = io.resolve(&path);
    let mut files = Vec::new();
    if io.is_regular_file(&abs) {
        files.push((abs.clone(), path.clone()));
    } else if io.is_directory(&abs) {
        let listing = io.list_entries(&abs, 0, ListKind::Files);
        if let Some(err) = listing.err {
            return Ok(error(format!("{err}: {path}")));
        }
        for e in listing.entries {
            if !path_glob_match(&include, &e.rel)
                || (!exclude.is_empty() && path_glob_match(&exclude, &e.rel))
            {
                continue;
            }
            files.push((format!("{}/{}", abs.trim_end_matches('/'), e.rel), e.rel));
        }
    } else {
        return Ok(error(format!("path does not exist: {path}")));
    }
    let mut out = String::new();
    let mut total = 0usize;
    let mut limit_reached = false;
    let show_num = show_lineno || ctx > 0;
    'files: for (file, display) in files {
        let Some(content) = io.read_file(&file) else {
            continue;
        };
        let content = String::from_utf8_lossy(&content);
        let all: Vec<&str> = lines(&content).collect();
        for (i, line) in all.iter().enumerate() {
            if total >= GREP_MAX_RESULTS {
                limit_reached = true;
                break 'files;
            }
            if !regex.is_match(line) {
                continue;
            }
            let (from, to) = (i.saturating_sub(ctx), (i + ctx).min(all.len() - 1));
            for (j, text) in all.iter().enumerate().take(to + 1).skip(from) {
                let sep = if j == i { ':' } else { '-' };
                out.push_str(&display);
                out.push(sep);
                if show_num {
                    out.push_str(&format!("{}{sep}", j + 1));
                }
                out.push_str(text);
                out.push('\n');
            }
            if ctx > 0 {
                out.push_str("--\n");
            }
            total += 1;
        }
    }
    out.push_str(&format!("\n---\nTotal matches: {total}\n"));
    if limit_reached {
        out.push_str(&format!(
            "[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
        ));
    }
    Ok(json!({ "plain_text_response": out }))
}

fn exec_shell_command(
    params: &Value,
    on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
) -> Result<Value, ToolError> {
    let command = req_str(params, "command")?;
    let timeout = opt_i64(params, "timeout", 10).clamp(0, EXEC_MAX_TIMEOUT) as u64;
    let max_output =
        opt_i64(params, "max_output_size", EXEC_MAX_OUTPUT).clamp(0, EXEC_MAX_OUTPUT) as usize;
    let io = tools_io(params)?;
    let args = sv(&["sh", "-c", &command]);
    let streamed = on_chunk.is_some();
    let mut opts = RunOptions::new(max_output, timeout);
    opts.on_chunk = on_chunk;
    let res = io.run(&args, opts);
    let mut tail = format!("\n[exit code: {}]", res.exit_code);
    if res.timed_out {
        tail.push_str(" [exit due to timed out]");
    }
    if streamed {
        // The caller sends the tail as the last chunk.
        return Ok(json!({ "stream_tail": tail }));
    }
    Ok(json!({ "plain_text_response": format!("{}{tail}", res.output) }))
}

fn write_file(params: &Value) -> Result<Value, ToolError> {
    let path = req_str(params, "path")?;
    let content = req_str(params, "content")?;
    let io = tools_io(params)?;
    if !io.write_file(&path, content.as_bytes()) {
        return Ok(error(format!("failed to write file: {path}")));
    }
    Ok(json!({ "result": "file written successfully", "path": path, "bytes": content.len() }))
}

fn edit_file(params: &Value) -> Result<Value, ToolError> {
    let path = req_str(params, "path")?;
    let Some(list) = params.get("edits") else {
        return Err(ToolError::Param("missing parameter \"edits\"".into()));
    };
    let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
        return Ok(error("\"edits\" must be a non-empty array".into()));
    };
    let mut edits = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let old_text = req_str(e, "old_text")?;
        let new_text = req_str(e, "new_text")?;
        if old_text.is_empty() {
            return Ok(error(format!("edits[{i}].old_text must not be empty")));
        }
        edits.push(edit::Edit { old_text, new_text });
    }
    let io = tools_io(params)?;
    let Some(original) = io.read_file(&path) else {
        return Ok(error(format!("failed to open file: {path}")));
    };
    let original = String::from_utf8_lossy(&original).into_owned();
    let new_content = match edit::apply(&original, &edits, &path) {
        Ok(c) => c,
        Err(message) => return Ok(error(message)),
    };
    if !io.write_file(&path, new_content.as_bytes()) {
        return Ok(error(format!("failed to write file: {path}")));
    }
    Ok(json!({ "result": "file edited successfully", "path": path, "edits_applied": edits.len() }))
}

fn get_info(params: &Value) -> Result<Value, ToolError> {
    let io = tools_io(params)?;
    let res = io.run(
        &sv(&["uname", "-a"]),
        RunOptions::new(GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT),
    );
    let os = if res.exit_code == 0 && !res.timed_out {
        res.output.trim().to_owned()
    } else {
        "unknown".to_owned()
    };
    let mut cwd = opt_str(params, "cwd", "");
    if cwd.is_empty() {
        if io.isolate.is_none() {
            cwd = std::env::current_dir()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default();
        } else {
            let pwd = io.run(
                &sv(&["pwd"]),
                RunOptions::new(GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT),
            );
            cwd = if pwd.exit_code == 0 && !pwd.timed_out {
                pwd.output.trim().to_owned()
            } else {
                "unknown".to_owned()
            };
        }
    }
    Ok(json!({ "os": os, "cwd": cwd }))
}

/// Standard base64 with padding.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "builtin_tests.rs"]
mod tests;
