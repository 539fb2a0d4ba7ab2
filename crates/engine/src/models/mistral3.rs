//! Mistral 3 as Hugging Face releases it (`Mistral3ForConditionalGeneration`: Mistral Small
//! 3.x, Ministral 3, Devstral): its language model run alone, as mlx-lm's mistral3.py runs it
//! (the Pixtral tower and projector are not built). The text config is `text_config`, its head
//! untied unless it says otherwise; a `ministral3` text model is `ministral3.rs`, a `mistral4`
//! one (Mistral Small 4) `mistral4.rs`, any other (Mistral Small 3's `mistral`) is built as a
//! Llama, as mlx-lm builds them.

use serde_json::{json, Value};

use crate::error::{EngineError, LoadErrorKind};

/// The text model's config of a `mistral3` checkpoint's config.json.
pub fn text_config(config: &Value) -> Result<Value, EngineError> {
    let invalid =
        |detail: &str| EngineError::load(LoadErrorKind::InvalidWeights, detail.to_owned());
    let mut text = config.get("text_config").cloned().ok_or_else(|| {
        invalid("config.json: mistral3 needs a `text_config` (its language model)")
    })?;
    let fields = text
        .as_object_mut()
        .ok_or_else(|| invalid("config.json: mistral3 `text_config` must be an object"))?;
    fields.entry("tie_word_embeddings").or_insert(json!(false));
    let model_type = match fields.get("model_type").and_then(Value::as_str) {
        Some("ministral3") => "ministral3",
        Some("mistral4") => "mistral4",
        _ => "llama",
    };
    fields.insert("model_type".into(), json!(model_type));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_model_is_ministral3_mistral4_or_llama_with_an_untied_head_unless_said() {
        let c = text_config(&json!({"text_config": {"model_type": "mistral"}})).unwrap();
        assert_eq!(c["model_type"], "llama");
        assert_eq!(c["tie_word_embeddings"], false);
        let config =
            json!({"text_config": {"model_type": "ministral3", "tie_word_embeddings": true}});
        let c = text_config(&config).unwrap();
        assert_eq!(c["model_type"], "ministral3");
        assert_eq!(c["tie_word_embeddings"], true);
        let c = text_config(&json!({"text_config": {"model_type": "mistral4"}})).unwrap();
        assert_eq!(c["model_type"], "mistral4");
    }

    #[test]
    fn no_text_config_is_refused_by_name() {
        match text_config(&json!({"model_type": "mistral3"})) {
            Err(EngineError::Load { detail, .. }) => assert!(detail.contains("text_config")),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
