//! The context-capacity ladder: which static sequence shape a request runs in.
//!
//! Static-shape backends (the OpenXLA backend) compile one executable per *context capacity*, the
//! number of positions its KV cache holds. This crate decides which capacity a request gets, and
//! refuses requests that cannot fit, with the numbers. It is pure arithmetic over values: nothing
//! here compiles, allocates a cache, or reads a checkpoint.
//!
//! - [`LADDER`] is the set of capacities a command-line request may be sized to.
//! - [`resolve_context_capacity`] sizes one command-line request ([`Request`]) against a checkpoint
//!   window, honouring a pinned capacity, and returns a [`Resolution`] whose
//!   [`sizing_line`](Resolution::sizing_line) is what the CLI prints.
//! - [`server_buckets`] derives the capacities a server compiles, and [`route`] sends each request
//!   to the smallest bucket that holds its prompt and its whole budget.
//! - [`CapacityOverrides`] carries the two environment variables ([`CONTEXT_CAPACITY_ENV`],
//!   [`CONTEXT_BUCKETS_ENV`]); [`CapacityOverrides::from_env`] is the only function that reads the
//!   process environment.
//!
//! ```
//! use mlxcel_capacity::{resolve_context_capacity, MaxNewTokens, Request};
//!
//! // A 6-token prompt with the default unlimited budget, on a 131072-token checkpoint.
//! let request = Request::text(6, MaxNewTokens::Unlimited);
//! let resolution = resolve_context_capacity(&request, 131_072, None).unwrap();
//! assert_eq!(resolution.context_capacity, 1024);
//! assert_eq!(resolution.admitted_max_new_tokens, 1018);
//! assert_eq!(
//!     resolution.sizing_line().as_deref(),
//!     Some("context capacity 1024 for 6 prompt + up to 1018"),
//! );
//!
//! // A pinned capacity too small for the prompt is refused with the numbers.
//! let long = Request::text(553, MaxNewTokens::Limited(1));
//! let err = resolve_context_capacity(&long, 131_072, Some(300)).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300",
//! );
//! ```

mod buckets;
mod env;
mod error;
mod ladder;
mod resolve;

pub use buckets::{Route, derive_server_buckets, route, server_buckets};
pub use env::{
    CONTEXT_BUCKETS_ENV, CONTEXT_CAPACITY_ENV, CapacityOverrides, EnvError, parse_context_buckets,
    parse_context_capacity,
};
pub use error::CapacityError;
pub use ladder::{DEFAULT_XLA_GENERATION_BUDGET, LADDER, MAX_CONTEXT_CAPACITY, SMALLEST_BUCKET};
pub use resolve::{
    MaxNewTokens, Request, Resolution, admit, admit_in_window, resolve_context_capacity,
};
