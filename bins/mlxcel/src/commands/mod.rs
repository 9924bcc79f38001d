//! One module per subcommand.

pub mod bench;
pub mod capacity;
pub mod convert;
pub mod generate;
pub mod pull;
pub mod serve;
pub mod tokenize;
