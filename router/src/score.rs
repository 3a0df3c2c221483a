//! SGLang's `/v1/score`: for each item, the probabilities of the label tokens at the
//! position after the query joined with the item. One generation per item, run together
//! (they batch); the label logprobs are the full-vocabulary ones the shard computes for
//! every request, so a score is the same number `/generate` reports in `label_logprobs`.

use axum::extract::State;
use axum::Json;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sonde_proto::LogprobsMode;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::generation::{collect, TextTracker};
use crate::invalid;
use crate::json::ApiJson;
use crate::request::{Field, FieldNames, GenerationSpec, Prompt, ScoreSpec};
use crate::state::{AppState, Ready};
use crate::validation::ValidGenerate;

/// Text or token ids; read by hand so a wrong shape gets a sentence naming the shapes.
#[derive(Debug, Clone, PartialEq)]
pub enum TextOrIds {
    Text(String),
    Ids(Vec<i64>),
}

fn ids(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(Value::as_i64).collect()
}

impl TextOrIds {
    fn from_json(v: &Value) -> Option<Self> {
        match v {
            Value::String(s) => Some(TextOrIds::Text(s.clone())),
            _ => ids(v).map(TextOrIds::Ids),
        }
    }
}

/// `query`: a string or a list of token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Query(pub TextOrIds);

impl<'de> Deserialize<'de> for Query {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        TextOrIds::from_json(&value)
            .map(Query)
            .ok_or_else(|| serde::de::Error::custom("must be a string or a list of token ids"))
    }
}

/// `items`: a list of strings or a list of token-id lists.
#[derive(Debug, Clone, PartialEq)]
pub struct Items(pub Vec<TextOrIds>);

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let items = value.as_array().and_then(|items| {
            let items: Option<Vec<_>> = items.iter().map(TextOrIds::from_json).collect();
            items
        });
        items.map(Items).ok_or_else(|| {
            serde::de::Error::custom("must be a list of strings or a list of token-id lists")
        })
    }
}

fn query_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let one_of = OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::Integer)))
        .build();
    Schema::OneOf(one_of)
}

fn items_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let ids = ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::Integer));
    let one_of = OneOfBuilder::new()
        .item(ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::String)))
        .item(ArrayBuilder::new().items(ids))
        .build();
    Schema::OneOf(one_of)
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoringRequest {
    /// A string or a list of token ids.
    #[schema(schema_with = query_schema)]
    pub query: Query,
    /// Strings (joined to a text query before tokenizing) or token-id lists (concatenated
    /// to an id query): each is scored on query + item.
    #[schema(schema_with = items_schema)]
    pub items: Items,
    /// The tokens whose probabilities are reported, in this order.
    pub label_token_ids: Vec<i64>,
    /// Renormalise the labels' probabilities over the labels (else each is its
    /// full-vocabulary probability).
    #[serde(default)]
    pub apply_softmax: bool,
    /// Score item + query instead of query + item.
    #[serde(default)]
    pub item_first: bool,
    /// Accepted for clients that send it; one model is served.
    pub model: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScoringUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScoringResponse {
    /// Per item, per label: a probability.
    pub scores: Vec<Vec<f64>>,
    pub model: String,
    pub usage: ScoringUsage,
    /// Always `scoring`.
    pub object: String,
}

/// `/v1/score`'s names for the fields validation checks.
struct ScoreNames;

impl FieldNames for ScoreNames {
    fn name(&self, field: Field) -> Option<&'static str> {
        match field {
            Field::Prompt => Some("items"),
            Field::LabelIds => Some("label_token_ids"),
            _ => None,
        }
    }
}

/// The probabilities of label tokens after a query and each item (SGLang's scoring API).
#[utoipa::path(post, path = "/v1/score", tag = "Scoring", request_body = ScoringRequest,
    responses((status = 200, body = ScoringResponse)))]
pub async fn score(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ScoringRequest>,
) -> Result<Json<ScoringResponse>, ApiError> {
    let ready = state.ready()?;
    let prepared = prepare(ready, req, state.config.max_score_items).await?;
    let _permit = state.permit(prepared.generations())?;
    Ok(Json(run(ready, prepared).await?))
}

/// A validated scoring request (also a Vertex `query` instance).
pub(crate) struct Prepared {
    items: Vec<ValidGenerate>,
    apply_softmax: bool,
}

impl Prepared {
    /// One generation per item, each holding one concurrency permit.
    pub fn generations(&self) -> u32 {
        self.items.len() as u32
    }
}

pub(crate) async fn prepare(
    ready: &Ready,
    req: ScoringRequest,
    max_items: usize,
) -> Result<Prepared, ApiError> {
    let items = req.items.0;
    if items.is_empty() {
        return Err(invalid!("`items` must not be empty"));
    }
    if items.len() > max_items {
        return Err(invalid!(
            "`items` must have at most {max_items} entries (--max-score-items), got {}",
            items.len()
        ));
    }
    if req.label_token_ids.is_empty() {
        return Err(invalid!("`label_token_ids` must not be empty"));
    }
    let mut valid = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let prompt = joined(&req.query.0, item, req.item_first).ok_or_else(|| {
            invalid!("`query` and `items[{i}]` must both be text or both be token ids")
        })?;
        let spec = GenerationSpec {
            // The labels' logprobs at the next position come with the first token.
            max_new_tokens: Some(1),
            scores: ScoreSpec {
                mode: Some(LogprobsMode::Raw),
                label_ids: req.label_token_ids.clone(),
                ..ScoreSpec::default()
            },
            ..GenerationSpec::new(prompt)
        };
        let v = ready.validator.validate(spec).await;
        let v = v.map_err(|e| e.in_words(&ScoreNames).context(&format!("items[{i}]")))?;
        valid.push(v);
    }
    Ok(Prepared {
        items: valid,
        apply_softmax: req.apply_softmax,
    })
}

/// Query and item as one prompt: texts joined before tokenizing, ids concatenated.
fn joined(query: &TextOrIds, item: TextOrIds, item_first: bool) -> Option<Prompt> {
    let prompt = match (query, item) {
        (TextOrIds::Text(q), TextOrIds::Text(i)) => Prompt::Text {
            text: if item_first { i + q } else { format!("{q}{i}") },
            add_special_tokens: true,
        },
        (TextOrIds::Ids(q), TextOrIds::Ids(i)) => {
            let (a, b) = if item_first { (&i, q) } else { (q, &i) };
            Prompt::Ids(a.iter().chain(b).copied().collect())
        }
        _ => return None,
    };
    Some(prompt)
}

pub(crate) async fn run(ready: &Ready, p: Prepared) -> Result<ScoringResponse, ApiError> {
    let tokenizer = ready.validator.tokenizer();
    let runs = p.items.iter().map(|valid| {
        let tracker = TextTracker::new(tokenizer.clone(), Vec::new());
        async move { collect(ready.backend.schedule(valid.generation(0))?, tracker).await }
    });
    let generated = try_join_all(runs).await?;
    let mut scores = Vec::with_capacity(generated.len());
    for g in &generated {
        let first = g.tokens.first().ok_or_else(|| {
            ApiError::Internal("a scored item ended without its next-position scores".into())
        })?;
        scores.push(probabilities(&first.labels, p.apply_softmax));
    }
    let prompt_tokens = p
        .items
        .iter()
        .map(|v| v.request.input_ids.len() as u32)
        .sum();
    Ok(ScoringResponse {
        scores,
        model: ready.info.model_id.clone(),
        usage: ScoringUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
        object: "scoring".to_string(),
    })
}

/// Label probabilities from their logprobs, in f64: each `exp(logprob)`, or with `softmax`
/// renormalised over the labels (shifted by the largest, so none overflows).
pub fn probabilities(logprobs: &[f32], softmax: bool) -> Vec<f64> {
    let lp: Vec<f64> = logprobs.iter().map(|&x| f64::from(x)).collect();
    if !softmax {
        return lp.iter().map(|x| x.exp()).collect();
    }
    let max = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = lp.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_are_exp_or_renormalised() {
        let lp = [-1.0f32, -2.0, -3.0];
        let p = probabilities(&lp, false);
        assert_eq!(p, [(-1.0f64).exp(), (-2.0f64).exp(), (-3.0f64).exp()]);
        let s = probabilities(&lp, true);
        let z: f64 = p.iter().sum();
        for (a, b) in s.iter().zip(&p) {
            assert!((a - b / z).abs() < 1e-15);
        }
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        // Far below f64's exp range, the shift keeps them finite.
        assert_eq!(probabilities(&[-2000.0, -2000.0], true), [0.5, 0.5]);
    }

    #[test]
    fn query_and_item_join_in_order() {
        let text = |s: &str| TextOrIds::Text(s.to_string());
        let q = text("Is it good? ");
        let got = joined(&q, text("Yes"), false);
        let want = Prompt::Text {
            text: "Is it good? Yes".into(),
            add_special_tokens: true,
        };
        assert_eq!(got, Some(want));
        let q = TextOrIds::Ids(vec![1, 2]);
        assert_eq!(
            joined(&q, TextOrIds::Ids(vec![3]), true),
            Some(Prompt::Ids(vec![3, 1, 2]))
        );
        assert_eq!(joined(&q, text("x"), false), None);
    }
}
