//! Gemma 4 as Hugging Face releases it (`Gemma4ForConditionalGeneration`, `model_type` gemma4):
//! its language model run alone, as mlx-lm's gemma4.py runs it (the vision and audio towers
//! are not built). The text config is `text_config` with the checkpoint's `vocab_size` (262144
//! when absent) written over its own, as mlx-lm does; the model is `gemma4_text.rs`.

use serde_json::{json, Value};

use crate::error::{EngineError, LoadErrorKind};

/// The `gemma4_text` config of a `gemma4` checkpoint's config.json.
pub fn text_config(config: &Value) -> Result<Value, EngineError> {
    let mut text = config
        .get("text_config")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let Some(fields) = text.as_object_mut() else {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: gemma4 `text_config` must be an object",
        ));
    };
    let vocab = config.get("vocab_size").cloned().unwrap_or(json!(262144));
    fields.insert("vocab_size".into(), vocab);
    fields.insert("model_type".into(), json!("gemma4_text"));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoints_vocabulary_is_written_over_the_text_configs() {
        let config =
            json!({"vocab_size": 1000, "text_config": {"vocab_size": 5, "hidden_size": 8}});
        let c = text_config(&config).unwrap();
        assert_eq!(c["vocab_size"], 1000);
        assert_eq!(c["hidden_size"], 8);
        assert_eq!(c["model_type"], "gemma4_text");
        // mlx-lm's default when the checkpoint gives none.
        let c = text_config(&json!({"text_config": {"vocab_size": 5}})).unwrap();
        assert_eq!(c["vocab_size"], 262144);
    }
}
