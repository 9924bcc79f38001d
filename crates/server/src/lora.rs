//! LoRA scales on the wire: llama-server's `[{"id": 0, "scale": 0.5}, ...]` lists (a request's
//! `lora` field, `POST /lora-adapters`' body), and the scales a request runs with. As in
//! llama-server, an adapter a list leaves out is at scale 0; an id that names no loaded
//! adapter is refused here (llama-server skips it without a word).

use serde_json::Value;

use crate::error::ApiError;

/// A list's entries as sent: (id, scale).
pub type LoraList = Vec<(usize, f32)>;

/// Reads a list of `{id, scale}` objects (`field` names it in errors); `scale` defaults to 0
/// as in llama-server.
pub fn parse_lora_list(value: &Value, field: &str) -> Result<LoraList, ApiError> {
    let shape = || {
        format!("{field}: expected an array of objects with `id` (a loaded adapter's) and `scale`")
    };
    let Value::Array(items) = value else {
        return Err(ApiError::invalid_param(field, shape()));
    };
    items
        .iter()
        .map(|item| {
            let Value::Object(entry) = item else {
                return Err(ApiError::invalid_param(field, shape()));
            };
            let id = entry
                .get("id")
                .and_then(Value::as_u64)
                .ok_or_else(|| ApiError::invalid_param(field, format!("{}: {item}", shape())))?;
            let scale = match entry.get("scale") {
                None | Some(Value::Null) => 0.0,
                Some(v) => v
                    .as_f64()
                    .map(|s| s as f32)
                    .filter(|s| s.is_finite())
                    .ok_or_else(|| {
                        ApiError::invalid_param(
                            field,
                            format!("{field}: adapter {id}: `scale` must be a number, got {v}"),
                        )
                    })?,
            };
            Ok((id as usize, scale))
        })
        .collect()
}

/// The scales of `loaded` adapters a list sets: listed ids at their scale, the others 0.
pub fn scales_of(list: &[(usize, f32)], loaded: usize, field: &str) -> Result<Vec<f32>, ApiError> {
    let mut scales = vec![0.0; loaded];
    for &(id, scale) in list {
        let Some(slot) = scales.get_mut(id) else {
            let ids = match loaded {
                0 => "no adapter is loaded (start the server with --lora)".to_owned(),
                n => format!("the loaded adapters are ids 0 to {}", n - 1),
            };
            return Err(ApiError::invalid_param(
                field,
                format!("{field}: adapter id {id} is not loaded; {ids}"),
            ));
        };
        *slot = scale;
    }
    Ok(scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_sets_its_ids_and_leaves_the_others_at_zero() {
        let list = parse_lora_list(&json!([{"id": 1, "scale": 0.5}, {"id": 2}]), "lora").unwrap();
        assert_eq!(list, [(1, 0.5), (2, 0.0)]);
        assert_eq!(scales_of(&list, 3, "lora").unwrap(), [0.0, 0.5, 0.0]);
        assert_eq!(scales_of(&[], 2, "lora").unwrap(), [0.0, 0.0]);
    }

    #[test]
    fn malformed_lists_and_unknown_ids_are_refused_naming_the_field() {
        for bad in [
            json!({"id": 0}),
            json!([1]),
            json!([{"scale": 1}]),
            json!([{"id": 0, "scale": "x"}]),
        ] {
            let e = parse_lora_list(&bad, "lora").unwrap_err().to_string();
            assert!(e.contains("lora"), "{bad}: {e}");
        }
        let e = scales_of(&[(2, 1.0)], 2, "lora").unwrap_err().to_string();
        assert!(
            e.contains("adapter id 2 is not loaded") && e.contains("0 to 1"),
            "{e}"
        );
        let e = scales_of(&[(0, 1.0)], 0, "lora").unwrap_err().to_string();
        assert!(e.contains("--lora"), "{e}");
    }
}
