//! llama-server's routes: `/completion` and `/infill` (`completion.rs`, answered in
//! `answer.rs`, the fill-in-the-middle prompt in `fim.rs`), `/tokenize`, `/detokenize`,
//! `/apply-template` (`tokens.rs`), `/health`, `/live`, `/props`, `/metrics` (`status.rs`),
//! `GET/POST /lora-adapters` (`lora_adapters.rs`), `GET /slots` (`slots.rs`) and `POST /slots/{id}` (`slot_files.rs`, the file in
//! `slot_file.rs`).

mod answer;
mod completion;
mod fim;
pub(crate) mod lora_adapters;
mod slot_file;
pub(crate) mod slot_files;
mod slots;
mod status;
mod tokens;

pub(crate) use completion::check_body;
pub use completion::{completion, infill};
pub(crate) use slot_file::parse_slot_file;
pub use slots::slots;
pub use status::{health, live, metrics, props, set_props};
pub use tokens::{apply_template, detokenize, tokenize};
