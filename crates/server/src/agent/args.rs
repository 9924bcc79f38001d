//! The agent flags of llama-server (`--tools`, `--tools-runtime`, `--mcp-servers-config`,
//! `--mcp-servers-json`, `-ag/--agent`, `--ui-mcp-proxy`), flattened into
//! [`crate::ServerArgs`], and the [`AgentConfig`] they make.

use std::path::PathBuf;

use clap::Args;

use super::AgentConfig;
use crate::llama_flags::llama_bool;

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Experimental, do not enable in untrusted environments: built-in tools for AI agents at
    /// `/tools`, comma-separated (`all`, or read_file, file_glob_search, grep_search,
    /// exec_shell_command, write_file, edit_file, get_info). Limits CORS to local origins unless
    /// `--cors-origins` is given.
    #[arg(long = "tools", env = "LLAMA_ARG_TOOLS", value_delimiter = ',')]
    pub tools: Vec<String>,

    /// Experimental: where tools run: `docker:<image>`/`podman:<image>` (a container started
    /// for this server and removed at exit), `docker-container:<id>`/`podman-container:<id>` (a
    /// running container), `ssh:<target>` (a remote POSIX host; key authentication and a known
    /// host key required). Default: this host.
    #[arg(long = "tools-runtime", env = "LLAMA_ARG_TOOLS_RUNTIME")]
    pub tools_runtime: Option<String>,

    /// Experimental, do not enable in untrusted environments: a JSON file of MCP servers
    /// (Cursor's `{"mcpServers": {...}}`) whose tools `/tools` offers. Limits CORS to local
    /// origins unless `--cors-origins` is given.
    #[arg(long = "mcp-servers-config", env = "LLAMA_ARG_MCP_SERVERS_CONFIG")]
    pub mcp_servers_config: Option<PathBuf>,

    /// Experimental: MCP servers as inline JSON (the format of `--mcp-servers-config`).
    #[arg(long = "mcp-servers-json", env = "LLAMA_ARG_MCP_SERVERS_JSON")]
    pub mcp_servers_json: Option<String>,

    /// Experimental, do not enable in untrusted environments: the CORS proxy at `/cors-proxy`
    /// (for a web page reaching MCP servers).
    #[arg(
        long = "ui-mcp-proxy",
        alias = "webui-mcp-proxy",
        env = "LLAMA_ARG_UI_MCP_PROXY",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        overrides_with = "no_ui_mcp_proxy"
    )]
    pub ui_mcp_proxy: bool,

    /// The CORS proxy off (the default).
    #[arg(
        long = "no-ui-mcp-proxy",
        alias = "no-webui-mcp-proxy",
        overrides_with = "ui_mcp_proxy"
    )]
    pub no_ui_mcp_proxy: bool,

    /// Do not enable in untrusted environments: every built-in tool and the CORS proxy (as
    /// `--tools all --ui-mcp-proxy`). Limits CORS to local origins unless `--cors-origins` is
    /// given.
    #[arg(
        long = "agent",
        env = "LLAMA_ARG_AGENT",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_missing_value = "true",
        overrides_with = "no_agent"
    )]
    pub agent: Option<bool>,

    /// `-no-ag`: no built-in tool and no CORS proxy, whatever `--tools` and `--ui-mcp-proxy`
    /// say.
    #[arg(long = "no-agent", overrides_with = "agent")]
    pub no_agent: bool,
}

impl AgentArgs {
    /// The settings: `-ag` over `--tools` and `--ui-mcp-proxy`, `-no-ag` clearing both.
    pub fn config(&self) -> AgentConfig {
        let mut config = AgentConfig {
            tools: self
                .tools
                .iter()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect(),
            runtime: self.tools_runtime.clone().filter(|r| !r.is_empty()),
            mcp_config: self
                .mcp_servers_config
                .clone()
                .filter(|p| !p.as_os_str().is_empty()),
            mcp_json: self.mcp_servers_json.clone().filter(|j| !j.is_empty()),
            proxy: self.ui_mcp_proxy && !self.no_ui_mcp_proxy,
        };
        match (self.agent, self.no_agent) {
            (_, true) | (Some(false), _) => {
                config.tools.clear();
                config.proxy = false;
            }
            (Some(true), false) => {
                config.tools = vec!["all".into()];
                config.proxy = true;
            }
            (None, false) => {}
        }
        config
    }
}
