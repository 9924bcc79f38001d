//! One module per subcommand.

pub mod capacity;
