//! A pipeline stage's step ([`LlamaModel::forward_stage`]): this stage's layers over the hidden
//! states the stage before it computed (or over the step's tokens, on the first stage), and the
//! rows that leave the step on the last.

use super::forward::ForwardSeq;
use super::model::LlamaModel;
use super::stage::Stage;
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};

impl LlamaModel {
    /// The part of the model this process holds.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// This stage's part of one step, not yet evaluated. `input`: `None` on the first stage (it
    /// embeds the sequences' tokens), else the hidden states the stage before computed
    /// (`[tokens, hidden]` f32, the sequences' rows in order). Returns, on the last stage, the
    /// rows that leave the step (each sequence's last, or with `firsts` its rows from
    /// `firsts[i]` on) normed, and as f32 logits when this stage holds the projection; on any
    /// other stage every row's hidden states after its layers. The caller evaluates the result
    /// (typically inside a send to the next stage) with [`LlamaModel::finish_stage`].
    pub fn forward_stage(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        input: Option<Array>,
        firsts: Option<&[usize]>,
    ) -> Result<Array> {
        if let Some(firsts) = firsts {
            let fits = firsts.len() == seqs.len()
                && seqs.iter().zip(firsts).all(|(s, &f)| f < s.tokens.len());
            if !fits {
                return Err(Error::Mlx {
                    op: "forward_stage",
                    message: format!(
                        "first rows {firsts:?} do not fit the step's {} sequences",
                        seqs.len()
                    ),
                });
            }
        }
        let ids = self.begin_step(seqs)?;
        let x = match input {
            None => self.embed_tokens(&ids)?,
            Some(x) => {
                let want = [ids.len() as i32, self.config.hidden_size as i32];
                if x.shape() != want {
                    return Err(Error::Mlx {
                        op: "forward_stage",
                        message: format!(
                            "hidden states of shape {:?} for a step of shape {want:?}",
                            x.shape()
                        ),
                    });
                }
                x
            }
        };
        let x = self.run_layers(x, seqs)?;
        if !self.stage.norm {
            return Ok(x);
        }
        let rows = self.final_rows(x, seqs, firsts)?;
        if self.stage.head {
            self.project(&rows)
        } else {
            rows.astype(Dtype::F32)
        }
    }

    /// Evaluates `outputs` of a [`LlamaModel::forward_stage`] step (its result, or the send
    /// that carries it) with the keys and values the step wrote, and counts the step's
    /// positions in the caches.
    pub fn finish_stage(&self, seqs: &mut [ForwardSeq<'_>], outputs: &[&Array]) -> Result<()> {
        self.end_step(seqs, outputs)
    }

    /// Logits (`vocab_size` floats a row) of normed final rows another stage computed: the
    /// first stage's projection with a tied embedding table.
    pub fn project_rows(&self, rows: &Array) -> Result<Vec<Vec<f32>>> {
        self.project(rows)?.to_rows_f32(self.config.vocab_size)
    }
}
