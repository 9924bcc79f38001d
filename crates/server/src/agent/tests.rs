use super::*;

fn config(tools: &[&str]) -> AgentConfig {
    AgentConfig {
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        ..AgentConfig::default()
    }
}

#[tokio::test]
async fn tools_are_checked_and_the_warning_names_what_is_on() {
    let err = Agent::start(&config(&["read_file", "web_search"]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "--tools: unknown tool \"web_search\". available tools: read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info"
    );
    let err = Agent::start(&AgentConfig {
        runtime: Some("fake:x".into()),
        ..config(&["all"])
    })
    .await
    .unwrap_err();
    assert_eq!(err, "--tools-runtime: unknown tool runtime: fake:x");

    let cfg = AgentConfig {
        proxy: true,
        runtime: Some("ssh:me@host".into()),
        ..config(&["read_file", "get_info"])
    };
    let agent = Agent::start(&cfg).await.unwrap();
    let names: Vec<_> = agent.tools.iter().map(Tool::name).collect();
    assert_eq!(names, ["read_file", "get_info"]);
    assert_eq!(
        agent.warning(&cfg).unwrap(),
        "security: MCP proxy (experimental), server tools (experimental), tools runtime (experimental) enabled - do not expose to untrusted environments"
    );
    let off = Agent::start(&AgentConfig::default()).await.unwrap();
    assert_eq!(off.warning(&AgentConfig::default()), None);
    assert_eq!(
        get_tools(Some(&Arc::new(off))).status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(get_tools(None).status(), StatusCode::FORBIDDEN);
}

#[test]
fn flags_make_the_config() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        agent: args::AgentArgs,
    }
    let parse = |a: &[&str]| {
        Cli::try_parse_from(std::iter::once("x").chain(a.iter().copied()))
            .unwrap()
            .agent
            .config()
    };
    let c = parse(&["--tools", "read_file,grep_search"]);
    assert_eq!(c.tools, ["read_file", "grep_search"]);
    assert!(!c.proxy && c.tools_or_mcp());
    let c = parse(&["--agent"]);
    assert_eq!((c.tools, c.proxy), (vec!["all".to_owned()], true));
    let c = parse(&["--tools", "read_file", "--ui-mcp-proxy", "--no-agent"]);
    assert!(c.tools.is_empty() && !c.proxy);
    let c = parse(&["--webui-mcp-proxy"]);
    assert!(c.proxy && !c.tools_or_mcp());
    let c = parse(&["--ui-mcp-proxy", "--no-ui-mcp-proxy"]);
    assert!(!c.proxy);
    let c = parse(&["--mcp-servers-json", "{}"]);
    assert!(c.tools_or_mcp());
}
