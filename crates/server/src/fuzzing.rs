//! Entry points for the fuzz targets (`fuzz/`, docs/reliability.md): every route's request body
//! parsed and checked as its handler does before it needs the model, without a server or an
//! engine. Not part of the stable API.

pub use crate::routes::{check_request_body, post_paths};
