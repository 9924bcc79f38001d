//! The MLX backend of an encoder ([`mlxcel_core::BertModel`]): it returns hidden states (for
//! embeddings and a reranker's head) and refuses everything that generates, since an encoder has
//! no next-token logits and no KV cache.

use mlxcel_core::BertModel;
use mlxcel_model::encoder::BertCheckpoint;

use crate::backend::{Backend, RequestShape, SequenceStep, SessionPlan, SlotId};
use crate::error::EngineError;

pub(crate) struct EncoderBackend {
    model: BertModel,
    vocab: usize,
}

impl EncoderBackend {
    pub(crate) fn load(checkpoint: &BertCheckpoint) -> Result<Self, EngineError> {
        let model = BertModel::new(checkpoint).map_err(|e| EngineError::backend("mlx", e))?;
        Ok(Self {
            model,
            vocab: checkpoint.config.vocab,
        })
    }

    fn refuse() -> EngineError {
        crate::encoder::generation_refused()
    }
}

impl Backend for EncoderBackend {
    fn name(&self) -> &'static str {
        "mlx"
    }

    fn window(&self) -> usize {
        self.model.positions()
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn create_session_for_request(&self, _: &RequestShape) -> Result<SessionPlan, EngineError> {
        Err(Self::refuse())
    }

    fn allocate_slot(&mut self, _: &SessionPlan) -> Result<SlotId, EngineError> {
        Err(Self::refuse())
    }

    fn step(&mut self, _: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        Err(Self::refuse())
    }

    fn release_slot(&mut self, _: SlotId) {}

    fn execution(&self) -> String {
        "BERT encoder, f32 on MLX".into()
    }

    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.model
            .forward(tokens)
            .map_err(|e| EngineError::backend("mlx", e))
    }
}
