//! The built-in tools run for real on this host, in a temp dir.

use super::*;

fn call(name: &str, params: Value) -> Value {
    match invoke(name, &params, None) {
        Ok(v) => v,
        Err(ToolError::Param(m) | ToolError::Runtime(m)) => panic!("{name}: {m}"),
    }
}

fn text(v: &Value) -> &str {
    v["plain_text_response"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn write_read_and_edit_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    let out = call(
        "write_file",
        json!({ "path": "sub/test.log", "content": "line1\nline2\nline3\n", "cwd": cwd }),
    );
    assert_eq!(
        out,
        json!({ "result": "file written successfully", "path": "sub/test.log", "bytes": 18 })
    );
    let path = dir
        .path()
        .join("sub/test.log")
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        text(&call("read_file", json!({ "path": path }))),
        "line1\nline2\nline3\n"
    );
    let out = call(
        "read_file",
        json!({ "path": path, "start_line": 2, "end_line": 3, "append_loc": true }),
    );
    assert_eq!(text(&out), "2\u{2192}line2\n3\u{2192}line3\n");
    let out = call(
        "edit_file",
        json!({ "path": path, "edits": [
            { "old_text": "line2", "new_text": "line2-edited" },
            { "old_text": "line3\n", "new_text": "line3\nline4\n" },
        ] }),
    );
    assert_eq!(out["result"], "file edited successfully");
    assert_eq!(out["edits_applied"], 2);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "line1\nline2-edited\nline3\nline4\n"
    );
    let out = call(
        "edit_file",
        json!({ "path": path, "edits": [{ "old_text": "line", "new_text": "x" }] }),
    );
    assert_eq!(
        out["error"],
        format!("found 4 occurrences of edits[0].old_text in {path}, it must be unique")
    );
    let out = call("edit_file", json!({ "path": path, "edits": [] }));
    assert_eq!(out["error"], "\"edits\" must be a non-empty array");
    let out = call("read_file", json!({ "path": "/nonexistent/f" }));
    assert_eq!(out["error"], "cannot stat file: /nonexistent/f");
    let out = call("read_file", json!({ "path": path, "cwd": cwd }));
    assert!(text(&out).starts_with("line1"));
    let out = invoke("read_file", &json!({ "start_line": 1 }), None);
    assert!(matches!(out, Err(ToolError::Param(m)) if m == "missing parameter \"path\""));
}

#[test]
fn read_file_limits_and_base64() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "0123456789\n".repeat(2000)).unwrap();
    let path = big.to_string_lossy().into_owned();
    let out = call("read_file", json!({ "path": path }));
    assert_eq!(
        out["error"],
        "file too large (22000 bytes, max 16384). Use start_line/end_line to read a portion."
    );
    let out = call(
        "read_file",
        json!({ "path": path, "start_line": 1, "end_line": 100000 }),
    );
    assert!(text(&out).ends_with("0123456789\n[output truncated]"));
    assert_eq!(text(&out).len(), 1489 * 11 + "[output truncated]".len());
    std::fs::write(&big, b"hi\xff!").unwrap();
    let out = call("read_file", json!({ "path": path, "resp_type": "base64" }));
    assert_eq!(out, json!({ "base64": "aGn/IQ==", "size_bytes": 4 }));
}

#[test]
fn file_glob_search_types_depth_limit_and_junk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("project-alpha/src")).unwrap();
    std::fs::write(p.join("project-alpha/README.md"), "alpha").unwrap();
    std::fs::write(p.join("project-alpha/src/main.cpp"), "int main() {}").unwrap();
    std::fs::create_dir_all(p.join("build/nested")).unwrap();
    std::fs::write(p.join("build/artifact.txt"), "built").unwrap();
    std::fs::write(p.join("top.txt"), "top").unwrap();
    let base = p.to_string_lossy().into_owned();

    let out = call("file_glob_search", json!({ "path": base, "type": "dir" }));
    let t = text(&out);
    assert!(
        t.contains("project-alpha/\n")
            && t.contains("project-alpha/src/\n")
            && t.contains("build/\n"),
        "{t}"
    );
    assert!(!t.contains("README") && !t.contains("nested"), "{t}");
    assert_eq!(out["base"], base);

    let out = call("file_glob_search", json!({ "path": base, "type": "all" }));
    let mut paths: Vec<_> = out["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "build",
            "project-alpha",
            "project-alpha/README.md",
            "project-alpha/src",
            "project-alpha/src/main.cpp",
            "top.txt"
        ]
    );

    let out = call("file_glob_search", json!({ "path": base, "max_depth": 1 }));
    assert_eq!(
        out["entries"],
        json!([{ "path": "top.txt", "type": "file" }])
    );
    let out = call(
        "file_glob_search",
        json!({ "path": ".", "include": "src/*.cpp", "cwd": base }),
    );
    assert_eq!(
        out["entries"],
        json!([{ "path": "project-alpha/src/main.cpp", "type": "file" }])
    );
    let out = call("file_glob_search", json!({ "path": base, "limit": 1 }));
    assert_eq!(out["entries"].as_array().unwrap().len(), 1);
    assert!(
        text(&out).contains("\n---\nTotal matches: 3\n[1 results limit reached (3 total matches)."),
        "{out}"
    );
    let out = call(
        "file_glob_search",
        json!({ "path": base, "exclude": "*.md" }),
    );
    assert!(!text(&out).contains("README"));
    let out = call("file_glob_search", json!({ "path": base, "type": "bogus" }));
    assert_eq!(
        out["error"],
        "invalid type: bogus (expected \"file\", \"dir\" or \"all\")"
    );
    let out = call("file_glob_search", json!({ "path": base, "limit": 0 }));
    assert_eq!(out["error"], "invalid limit: 0 (expected 1 or more)");
    let out = call(
        "file_glob_search",
        json!({ "path": format!("{base}/none") }),
    );
    assert_eq!(
        out["error"],
        format!("path does not exist or is not a directory: {base}/none")
    );
}

#[test]
fn grep_search_matches_context_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("src")).unwrap();
    std::fs::write(p.join("src/a.rs"), "one\nTwo marker\nthree\nfour a.b\n").unwrap();
    std::fs::write(p.join("notes.txt"), "marker here\n").unwrap();
    let base = p.to_string_lossy().into_owned();

    let out = call(
        "grep_search",
        json!({ "path": base, "pattern": "marker", "include": "*.rs" }),
    );
    assert_eq!(text(&out), "src/a.rs:Two marker\n\n---\nTotal matches: 1\n");
    let out = call(
        "grep_search",
        json!({ "path": base, "pattern": "MARKER", "ignore_case": true, "include": "*.rs", "context_lines": 1 }),
    );
    assert_eq!(
        text(&out),
        "src/a.rs-1-one\nsrc/a.rs:2:Two marker\nsrc/a.rs-3-three\n--\n\n---\nTotal matches: 1\n"
    );
    let out = call(
        "grep_search",
        json!({ "path": base, "pattern": "a.b", "literal": true, "return_line_numbers": true }),
    );
    assert_eq!(text(&out), "src/a.rs:4:four a.b\n\n---\nTotal matches: 1\n");
    let file = p.join("notes.txt").to_string_lossy().into_owned();
    let out = call("grep_search", json!({ "path": file, "pattern": "here$" }));
    assert_eq!(
        text(&out),
        format!("{file}:marker here\n\n---\nTotal matches: 1\n")
    );
    let out = call("grep_search", json!({ "path": base, "pattern": "(" }));
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .starts_with("invalid regex: "),
        "{out}"
    );
    let out = call(
        "grep_search",
        json!({ "path": format!("{base}/none"), "pattern": "x" }),
    );
    assert_eq!(out["error"], format!("path does not exist: {base}/none"));
}

#[test]
fn exec_shell_command_runs_in_the_cwd_with_limits() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    let out = call(
        "exec_shell_command",
        json!({ "command": "echo hello > f.txt; cat f.txt; pwd; exit 4", "cwd": cwd }),
    );
    let canonical = dir
        .path()
        .canonicalize()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(text(&out), format!("hello\n{canonical}\n\n[exit code: 4]"));
    let out = call(
        "exec_shell_command",
        json!({ "command": "yes | head -c 100000", "max_output_size": 10 }),
    );
    assert_eq!(
        text(&out),
        "y\ny\ny\ny\ny\n\n[output truncated]\n[exit code: 0]"
    );
    let out = call(
        "exec_shell_command",
        json!({ "command": "sleep 20", "timeout": 1 }),
    );
    assert!(text(&out).ends_with("[exit due to timed out]"), "{out}");

    let mut chunks = Vec::new();
    let mut push = |c: &str| {
        chunks.push(c.to_owned());
        true
    };
    let out = invoke(
        "exec_shell_command",
        &json!({ "command": "echo a; sleep 0.2; echo b" }),
        Some(&mut push),
    )
    .unwrap();
    assert_eq!(chunks.concat(), "a\nb\n");
    assert_eq!(out, json!({ "stream_tail": "\n[exit code: 0]" }));
}

#[test]
fn get_info_reports_the_os_and_cwd() {
    let out = call("get_info", json!({ "cwd": "/some/where" }));
    assert_eq!(out["cwd"], "/some/where");
    assert!(
        out["os"].as_str().unwrap().starts_with("Linux") || !out["os"].as_str().unwrap().is_empty()
    );
}

#[test]
fn runtimes_that_cannot_be_used_are_errors_not_the_host() {
    for (runtime, message) in [
        (
            "fake:does-not-exist",
            "unknown tool runtime: fake:does-not-exist",
        ),
        (
            "ssh:-oProxyCommand=touch /tmp/pwned",
            "invalid ssh target: -oProxyCommand=touch /tmp/pwned",
        ),
        (
            "docker-container:--privileged",
            "invalid container id: --privileged",
        ),
    ] {
        let out = invoke(
            "exec_shell_command",
            &json!({ "command": "echo hi", "runtime": runtime }),
            None,
        );
        assert!(
            matches!(&out, Err(ToolError::Runtime(m)) if m == message),
            "{out:?}"
        );
    }
}

#[test]
fn definitions_are_llama_servers() {
    for name in NAMES {
        let d = definition(name);
        assert_eq!(d["type"], "function");
        assert_eq!(d["function"]["name"], *name);
        assert_eq!(d["function"]["parameters"]["type"], "object");
    }
    assert_eq!(
        definition("grep_search")["function"]["parameters"]["required"],
        json!(["path", "pattern"])
    );
    assert_eq!(
        definition("edit_file")["function"]["parameters"]["properties"]["edits"]["items"]["required"],
        json!(["old_text", "new_text"])
    );
    assert_eq!(
        definition("get_info")["function"]["parameters"],
        json!({ "type": "object", "properties": {} })
    );
    assert!(
        meta("exec_shell_command").stream && meta("write_file").write && !meta("read_file").write
    );
}
