//! Loading the MLX model (the whole of it, or a pipeline stage's part) with the kernels the
//! engine's options choose: what the MLX backend and a pipeline's stage workers share.

use mlxcel_core::{Kernels, LlamaModel, Stage};
use mlxcel_model::Checkpoint;

use crate::error::EngineError;
use crate::options::EngineOptions;

fn backend_error(err: mlxcel_core::Error) -> EngineError {
    EngineError::backend("mlx", err)
}

/// `stage` of the model in `checkpoint`: `options.threads` and the activations the options
/// choose for this model override `MLXCEL_THREADS` and `MLXCEL_ACTIVATIONS`, and its caches hold
/// keys and values as `options.kv_types` say.
pub(crate) fn load_model(
    checkpoint: &Checkpoint,
    stage: Stage,
    options: &EngineOptions,
) -> Result<LlamaModel, EngineError> {
    mlxcel_core::set_default_device_cpu().map_err(backend_error)?;
    let mut kernels = Kernels::from_env().map_err(backend_error)?;
    if let Some(threads) = options.threads {
        kernels.threads = threads.max(1);
    }
    if let Some(activations) = options.activations_for(checkpoint.config().parameter_count()) {
        kernels.activations = activations;
        // The option, not the variable, set them: the error names the flag the command lines
        // and the server spell it with.
        kernels.check("--activations").map_err(backend_error)?;
    }
    let mut model = LlamaModel::load_stage(checkpoint, kernels, stage).map_err(backend_error)?;
    let (k_type, v_type) = options.kv_types;
    model.set_kv_types(k_type, v_type).map_err(backend_error)?;
    Ok(model)
}
