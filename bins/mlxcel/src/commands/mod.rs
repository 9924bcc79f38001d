//! One module per subcommand.

pub mod bench;
pub mod capacity;
pub mod convert;
pub mod generate;
pub mod perplexity;
pub mod pull;
pub mod serve;
pub mod tokenize;

/// `--activations` (`f32` or `int8`), when given; the error names the flag.
pub fn parse_activations(
    value: Option<&str>,
) -> anyhow::Result<Option<mlxcel_engine::Activations>> {
    value
        .map(|v| {
            v.parse()
                .map_err(|err: String| anyhow::anyhow!("--activations: {err}"))
        })
        .transpose()
}
