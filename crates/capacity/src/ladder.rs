//! The constants every capacity decision starts from.

/// The capacities a command-line request may be sized to, ascending.
///
/// Each rung is one compiled executable shape; a request gets the smallest rung that holds its
/// effective prompt plus its sizing budget, bounded by the checkpoint window.
pub const LADDER: [usize; 8] = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768];

/// The generation budget used to size the shape of a request whose budget is unlimited (`-n -1`).
///
/// It only sizes the shape: the admitted budget of an unlimited request is whatever room the chosen
/// shape leaves after the prompt.
pub const DEFAULT_XLA_GENERATION_BUDGET: usize = 512;

/// The largest capacity anyone may pin: IREE passes sizes and indices as `i32`.
pub const MAX_CONTEXT_CAPACITY: usize = i32::MAX as usize;

/// The smallest bucket a server compiles, so that short requests keep a small shape.
pub const SMALLEST_BUCKET: usize = 256;

/// The largest derived server bucket: above it, requests need an explicit bucket list.
pub(crate) const LARGEST_DERIVED_BUCKET: usize = 4096;
