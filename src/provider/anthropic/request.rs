//! An OpenAI chat request → an Anthropic Messages API request. Every
//! top-level field is either translated, accepted because its value means
//! "the default" (e.g. `n: 1`), or refused with the field's name: the
//! table is in the [module doc](super).

use serde_json::{json, Map, Value};

use crate::provider::TranslateError;

/// Image types Anthropic accepts as a base64 source.
const IMAGE_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::new(field, reason)
}

/// See [`super::request`].
pub fn request(
    body: &Value,
    upstream_model: &str,
    default_max_tokens: u32,
) -> Result<Value, TranslateError> {
    let obj = body
        .as_object()
        .ok_or_else(|| refuse("body", "the request body must be a JSON object"))?;
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    let mut tool_choice: Option<Value> = None;
    let mut parallel = true;
    let mut max_tokens: Option<u64> = None;
    let mut max_completion_tokens: Option<u64> = None;
    // serde_json's map is ordered by key, so the first refused field is
    // the same for the same body.
    for (key, value) in obj {
        // An explicit `null` is the field's absence (SDKs send them).
        if value.is_null() {
            continue;
        }
        let key = key.as_str();
        match key {
            "model" => {
                if !value.is_string() {
                    return Err(refuse(key, "must be a string"));
                }
            }
            "messages" => {
                let (system, messages) = messages(value)?;
                if let Some(system) = system {
                    out.insert("system".into(), system);
                }
                out.insert("messages".into(), Value::Array(messages));
            }
            "max_tokens" => max_tokens = Some(positive(key, value)?),
            "max_completion_tokens" => max_completion_tokens = Some(positive(key, value)?),
            "temperature" => {
                let t = number(key, value)?;
                // OpenAI's range is 0–2, Anthropic's 0–1: a value above 1
                // has no faithful image (halving it would change 0.7 too).
                if !(0.0..=1.0).contains(&t) {
                    return Err(refuse(key, "Anthropic accepts a temperature from 0 to 1"));
                }
                out.insert(key.into(), value.clone());
            }
            "top_p" => {
                let p = number(key, value)?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(refuse(key, "must be from 0 to 1"));
                }
                out.insert(key.into(), value.clone());
            }
            "stop" => {
                let stops = match value {
                    Value::String(s) => vec![Value::String(s.clone())],
                    Value::Array(list) if list.iter().all(Value::is_string) => list.clone(),
                    _ => return Err(refuse(key, "must be a string or a list of strings")),
                };
                if !stops.is_empty() {
                    out.insert("stop_sequences".into(), Value::Array(stops));
                }
            }
            "stream" => {
                if !value.is_boolean() {
                    return Err(refuse(key, "must be true or false"));
                }
                out.insert(key.into(), value.clone());
            }
            "stream_options" => stream_options(value)?,
            "tools" => {
                let tools = tools(value)?;
                out.insert("tools".into(), Value::Array(tools));
            }
            "tool_choice" => tool_choice = Some(choice(value)?),
            "parallel_tool_calls" => {
                parallel = value
                    .as_bool()
                    .ok_or_else(|| refuse(key, "must be true or false"))?;
            }
            "user" => {
                let user = value
                    .as_str()
                    .ok_or_else(|| refuse(key, "must be a string"))?;
                out.insert("metadata".into(), json!({"user_id": user}));
            }
            // Accepted when they ask for what Anthropic does anyway.
            "n" => default_only(key, value.as_u64() == Some(1), "only n = 1 (one choice)")?,
            "logprobs" => default_only(key, value == &json!(false), "no log probabilities")?,
            "presence_penalty" | "frequency_penalty" => default_only(
                key,
                value.as_f64() == Some(0.0),
                "no presence or frequency penalty (only 0)",
            )?,
            "logit_bias" => default_only(
                key,
                value.as_object().is_some_and(Map::is_empty),
                "no logit bias",
            )?,
            "response_format" => default_only(
                key,
                value == &json!({"type": "text"}),
                "only the default `{\"type\": \"text\"}` (no JSON mode or JSON schema)",
            )?,
            "store" => default_only(key, value == &json!(false), "no stored completions")?,
            "modalities" => default_only(
                key,
                value == &json!(["text"]),
                "only text output (`[\"text\"]`)",
            )?,
            "service_tier" => default_only(
                key,
                value == &json!("auto") || value == &json!("default"),
                "only `auto` or `default`",
            )?,
            "top_logprobs" => return Err(refuse(key, "Anthropic returns no log probabilities")),
            "seed" => return Err(refuse(key, "Anthropic has no seeded sampling")),
            "metadata" => {
                return Err(refuse(
                    key,
                    "OpenAI's metadata is for stored completions, which Anthropic does not keep \
                     (send `user` for metadata.user_id)",
                ))
            }
            "functions" | "function_call" => {
                return Err(refuse(
                    key,
                    "the legacy functions API: send `tools` and `tool_choice`",
                ))
            }
            _ => return Err(refuse(key, "has no Anthropic Messages API equivalent")),
        }
    }
    if !out.contains_key("messages") {
        return Err(refuse("messages", "is required"));
    }
    let max = max_completion_tokens
        .or(max_tokens)
        .unwrap_or(u64::from(default_max_tokens).max(1));
    out.insert("max_tokens".into(), json!(max));
    if let Some(mut choice) = tool_choice.or_else(|| (!parallel).then(|| json!({"type": "auto"}))) {
        if !parallel && choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
        out.insert("tool_choice".into(), choice);
    }
    Ok(Value::Object(out))
}

fn number(key: &str, value: &Value) -> Result<f64, TranslateError> {
    value
        .as_f64()
        .ok_or_else(|| refuse(key, "must be a number"))
}

fn positive(key: &str, value: &Value) -> Result<u64, TranslateError> {
    value
        .as_u64()
        .filter(|&n| n >= 1)
        .ok_or_else(|| refuse(key, "must be a positive integer"))
}

/// A field accepted only with the value that means what Anthropic does.
fn default_only(key: &str, ok: bool, accepts: &str) -> Result<(), TranslateError> {
    if ok {
        Ok(())
    } else {
        Err(refuse(key, format!("Anthropic supports {accepts}")))
    }
}

fn stream_options(value: &Value) -> Result<(), TranslateError> {
    let obj = value
        .as_object()
        .ok_or_else(|| refuse("stream_options", "must be an object"))?;
    for (k, v) in obj {
        match k.as_str() {
            // Anthropic's stream always carries usage; `Stream` decides
            // whether the client sees the usage chunk.
            "include_usage" if v.is_boolean() || v.is_null() => {}
            "include_usage" => {
                return Err(refuse(
                    "stream_options.include_usage",
                    "must be true or false",
                ))
            }
            _ => {
                return Err(refuse(
                    format!("stream_options.{k}"),
                    "has no Anthropic Messages API equivalent",
                ))
            }
        }
    }
    Ok(())
}

/// OpenAI's `tools` (functions) → Anthropic's `tools`.
fn tools(value: &Value) -> Result<Vec<Value>, TranslateError> {
    let list = value
        .as_array()
        .ok_or_else(|| refuse("tools", "must be a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            let obj = tool
                .as_object()
                .ok_or_else(|| refuse(&at, "must be an object"))?;
            if obj.get("type").and_then(Value::as_str) != Some("function") {
                return Err(refuse(
                    format!("{at}.type"),
                    "only `function` tools translate to Anthropic",
                ));
            }
            if let Some(k) = obj
                .keys()
                .find(|k| !matches!(k.as_str(), "type" | "function"))
            {
                return Err(refuse(format!("{at}.{k}"), "has no Anthropic equivalent"));
            }
            let f = obj
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| refuse(format!("{at}.function"), "must be an object"))?;
            let mut out = Map::new();
            for (k, v) in f {
                if v.is_null() {
                    continue;
                }
                let field = format!("{at}.function.{k}");
                match k.as_str() {
                    "name" | "description" if v.is_string() => {
                        out.insert(k.clone(), v.clone());
                    }
                    "name" | "description" => return Err(refuse(field, "must be a string")),
                    "parameters" if v.is_object() => {
                        out.insert("input_schema".into(), v.clone());
                    }
                    "parameters" => return Err(refuse(field, "must be a JSON schema object")),
                    "strict" if v == &json!(false) => {}
                    "strict" => {
                        return Err(refuse(
                            field,
                            "Anthropic does not guarantee schema-conformant arguments",
                        ))
                    }
                    _ => return Err(refuse(field, "has no Anthropic equivalent")),
                }
            }
            if !out.contains_key("name") {
                return Err(refuse(format!("{at}.function.name"), "is required"));
            }
            // Anthropic requires a schema; OpenAI's default is "no arguments".
            out.entry("input_schema")
                .or_insert_with(|| json!({"type": "object", "properties": {}}));
            Ok(Value::Object(out))
        })
        .collect()
}

/// OpenAI's `tool_choice` → Anthropic's.
fn choice(value: &Value) -> Result<Value, TranslateError> {
    match value {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(json!({"type": "auto"})),
            "none" => Ok(json!({"type": "none"})),
            "required" => Ok(json!({"type": "any"})),
            _ => Err(refuse(
                "tool_choice",
                "must be `auto`, `none`, `required` or a named function",
            )),
        },
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| refuse("tool_choice.function.name", "is required"))?;
            Ok(json!({"type": "tool", "name": name}))
        }
        _ => Err(refuse(
            "tool_choice",
            "must be `auto`, `none`, `required` or `{\"type\": \"function\", …}`",
        )),
    }
}

/// A turn being built: consecutive messages of one role merge into it, as
/// Anthropic requires alternating turns.
struct Turn {
    role: &'static str,
    content: Content,
}

enum Content {
    /// One message's plain string, sent as Anthropic's string shorthand.
    Text(String),
    Blocks(Vec<Value>),
}

impl Content {
    fn into_blocks(self) -> Vec<Value> {
        match self {
            Content::Text(s) => vec![text_block(s)],
            Content::Blocks(b) => b,
        }
    }

    fn into_value(self) -> Value {
        match self {
            Content::Text(s) => Value::String(s),
            Content::Blocks(b) => Value::Array(b),
        }
    }
}

fn text_block(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// `messages` → (`system`, `messages`).
fn messages(value: &Value) -> Result<(Option<Value>, Vec<Value>), TranslateError> {
    let list = value
        .as_array()
        .ok_or_else(|| refuse("messages", "must be a list"))?;
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| refuse(&at, "must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| refuse(format!("{at}.role"), "is required (a string)"))?;
        let allowed: &[&str] = match role {
            "system" | "developer" | "user" => &["role", "content"],
            "assistant" => &["role", "content", "tool_calls", "refusal"],
            "tool" => &["role", "content", "tool_call_id"],
            "function" => {
                return Err(refuse(
                    format!("{at}.role"),
                    "the legacy `function` role: send `tool` messages",
                ))
            }
            _ => return Err(refuse(format!("{at}.role"), "unknown role")),
        };
        if let Some((k, _)) = obj
            .iter()
            .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
        {
            let reason = match k.as_str() {
                "name" => "Anthropic has no participant names",
                _ => "has no Anthropic equivalent",
            };
            return Err(refuse(format!("{at}.{k}"), reason));
        }
        let content = obj.get("content").unwrap_or(&Value::Null);
        let (role, content) = match role {
            "system" | "developer" => {
                system.extend(texts(&format!("{at}.content"), content)?);
                continue;
            }
            "user" => ("user", user_content(&format!("{at}.content"), content)?),
            "assistant" => ("assistant", assistant_content(&at, obj)?),
            _ => ("user", tool_result(&at, obj)?),
        };
        match turns.last_mut() {
            Some(last) if last.role == role => {
                let prev = std::mem::replace(&mut last.content, Content::Blocks(Vec::new()));
                let mut blocks = prev.into_blocks();
                blocks.extend(content.into_blocks());
                last.content = Content::Blocks(blocks);
            }
            _ => turns.push(Turn { role, content }),
        }
    }
    let system = match system.len() {
        0 => None,
        1 => system.pop().map(Value::String),
        _ => Some(Value::Array(system.into_iter().map(text_block).collect())),
    };
    let messages = turns
        .into_iter()
        .map(|t| json!({"role": t.role, "content": t.content.into_value()}))
        .collect();
    Ok((system, messages))
}

/// Text-only content (system, developer, tool): a string or text parts.
fn texts(at: &str, content: &Value) -> Result<Vec<String>, TranslateError> {
    match content {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| match part_type(at, j, part)? {
                "text" => part_text(at, j, part),
                _ => Err(refuse(
                    format!("{at}[{j}].type"),
                    "only text parts are accepted here",
                )),
            })
            .collect(),
        _ => Err(refuse(at, "must be a string or a list of text parts")),
    }
}

fn part_type<'a>(at: &str, j: usize, part: &'a Value) -> Result<&'a str, TranslateError> {
    part.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("{at}[{j}].type"), "is required (a string)"))
}

fn part_text(at: &str, j: usize, part: &Value) -> Result<String, TranslateError> {
    only_keys(at, j, part, &["type", "text"])?;
    part.get("text")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| refuse(format!("{at}[{j}].text"), "is required (a string)"))
}

fn only_keys(at: &str, j: usize, part: &Value, keys: &[&str]) -> Result<(), TranslateError> {
    if let Some(k) = part
        .as_object()
        .and_then(|o| o.keys().find(|k| !keys.contains(&k.as_str())))
    {
        return Err(refuse(
            format!("{at}[{j}].{k}"),
            "has no Anthropic equivalent",
        ));
    }
    Ok(())
}

/// A user message's content: text, images and PDF files.
fn user_content(at: &str, content: &Value) -> Result<Content, TranslateError> {
    let parts = match content {
        Value::String(s) => return Ok(Content::Text(s.clone())),
        Value::Array(parts) => parts,
        _ => return Err(refuse(at, "must be a string or a list of content parts")),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let block = match part_type(at, j, part)? {
            "text" => text_block(part_text(at, j, part)?),
            "image_url" => image(at, j, part)?,
            "file" => file(at, j, part)?,
            "input_audio" => {
                return Err(refuse(
                    format!("{at}[{j}].type"),
                    "Anthropic accepts no audio input",
                ))
            }
            _ => return Err(refuse(format!("{at}[{j}].type"), "unknown content part")),
        };
        blocks.push(block);
    }
    Ok(Content::Blocks(blocks))
}

/// `{"type": "image_url", "image_url": {"url", "detail"}}` → an image block.
/// `detail` is a resolution hint with no Anthropic counterpart; it is
/// accepted and not sent (the module doc's table says so).
fn image(at: &str, j: usize, part: &Value) -> Result<Value, TranslateError> {
    only_keys(at, j, part, &["type", "image_url"])?;
    let field = format!("{at}[{j}].image_url");
    let img = part
        .get("image_url")
        .and_then(Value::as_object)
        .ok_or_else(|| refuse(&field, "must be an object with a `url`"))?;
    if let Some(k) = img.keys().find(|k| !matches!(k.as_str(), "url" | "detail")) {
        return Err(refuse(
            format!("{field}.{k}"),
            "has no Anthropic equivalent",
        ));
    }
    let url = img
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("{field}.url"), "is required (a string)"))?;
    let source = if let Some(data) = url.strip_prefix("data:") {
        let (media_type, data) = data_url(&format!("{field}.url"), data)?;
        if !IMAGE_TYPES.contains(&media_type) {
            return Err(refuse(
                format!("{field}.url"),
                format!(
                    "Anthropic accepts images of type {}",
                    IMAGE_TYPES.join(", ")
                ),
            ));
        }
        json!({"type": "base64", "media_type": media_type, "data": data})
    } else if url.starts_with("https://") || url.starts_with("http://") {
        json!({"type": "url", "url": url})
    } else {
        return Err(refuse(
            format!("{field}.url"),
            "must be a data: URL or an http(s) URL",
        ));
    };
    Ok(json!({"type": "image", "source": source}))
}

/// `<media type>;base64,<data>` (after `data:`) → (media type, data).
fn data_url<'a>(field: &str, rest: &'a str) -> Result<(&'a str, &'a str), TranslateError> {
    rest.split_once(";base64,")
        .filter(|(media, _)| !media.contains([',', ';']))
        .ok_or_else(|| refuse(field, "a data: URL must be `data:<type>;base64,<data>`"))
}

/// `{"type": "file", "file": {"file_data": "data:application/pdf;base64,…"}}`
/// → a PDF document block; files by id have no Anthropic counterpart.
fn file(at: &str, j: usize, part: &Value) -> Result<Value, TranslateError> {
    only_keys(at, j, part, &["type", "file"])?;
    let field = format!("{at}[{j}].file");
    let f = part
        .get("file")
        .and_then(Value::as_object)
        .ok_or_else(|| refuse(&field, "must be an object"))?;
    if let Some(k) = f
        .keys()
        .find(|k| !matches!(k.as_str(), "file_data" | "filename"))
    {
        return Err(refuse(
            format!("{field}.{k}"),
            "only inline PDF `file_data` translates to Anthropic",
        ));
    }
    let data = f
        .get("file_data")
        .and_then(Value::as_str)
        .and_then(|d| d.strip_prefix("data:"))
        .ok_or_else(|| refuse(format!("{field}.file_data"), "must be a data: URL"))?;
    let (media_type, data) = data_url(&format!("{field}.file_data"), data)?;
    if media_type != "application/pdf" {
        return Err(refuse(
            format!("{field}.file_data"),
            "Anthropic accepts PDF documents (application/pdf)",
        ));
    }
    Ok(
        json!({"type": "document", "source": {"type": "base64", "media_type": media_type, "data": data}}),
    )
}

/// An assistant message: its text, then its tool calls as `tool_use` blocks.
fn assistant_content(at: &str, obj: &Map<String, Value>) -> Result<Content, TranslateError> {
    let content = obj.get("content").unwrap_or(&Value::Null);
    let calls = obj.get("tool_calls").filter(|c| !c.is_null());
    let refusal = obj.get("refusal").and_then(Value::as_str);
    let mut text: Vec<String> = match content {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(parts) => {
            let at = format!("{at}.content");
            parts
                .iter()
                .enumerate()
                .map(|(j, part)| match part_type(&at, j, part)? {
                    "text" => part_text(&at, j, part),
                    "refusal" => {
                        only_keys(&at, j, part, &["type", "refusal"])?;
                        part.get("refusal")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .ok_or_else(|| refuse(format!("{at}[{j}].refusal"), "is required"))
                    }
                    _ => Err(refuse(
                        format!("{at}[{j}].type"),
                        "an assistant turn holds only text and refusal parts",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            return Err(refuse(
                format!("{at}.content"),
                "must be a string or a list",
            ))
        }
    };
    // A refusal is what the assistant said in that turn.
    text.extend(refusal.map(str::to_owned));
    if calls.is_none() && content.is_string() && refusal.is_none() {
        return Ok(Content::Text(text.pop().unwrap_or_default()));
    }
    // Anthropic refuses empty text blocks; an empty `content` beside tool
    // calls is how OpenAI clients say "no text".
    let mut blocks: Vec<Value> = text
        .into_iter()
        .filter(|t| !t.is_empty())
        .map(text_block)
        .collect();
    if let Some(calls) = calls {
        let list = calls
            .as_array()
            .ok_or_else(|| refuse(format!("{at}.tool_calls"), "must be a list"))?;
        for (j, call) in list.iter().enumerate() {
            blocks.push(tool_use(&format!("{at}.tool_calls[{j}]"), call)?);
        }
    }
    Ok(Content::Blocks(blocks))
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}` → a
/// `tool_use` block whose `input` is the parsed arguments.
fn tool_use(at: &str, call: &Value) -> Result<Value, TranslateError> {
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("{at}.id"), "is required (a string)"))?;
    if call
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function")
        != "function"
    {
        return Err(refuse(
            format!("{at}.type"),
            "only `function` calls translate",
        ));
    }
    let f = call
        .get("function")
        .ok_or_else(|| refuse(format!("{at}.function"), "is required"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("{at}.function.name"), "is required (a string)"))?;
    let args = f.get("arguments").and_then(Value::as_str).unwrap_or("");
    let input = if args.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str::<Value>(args)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| {
                refuse(
                    format!("{at}.function.arguments"),
                    "must be a JSON object in a string (Anthropic's tool input is an object)",
                )
            })?
    };
    Ok(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
}

/// A `tool` message → a `tool_result` block of a user turn.
fn tool_result(at: &str, obj: &Map<String, Value>) -> Result<Content, TranslateError> {
    let id = obj
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("{at}.tool_call_id"), "is required (a string)"))?;
    let content = obj.get("content").unwrap_or(&Value::Null);
    let content = match content {
        Value::String(s) => Value::String(s.clone()),
        _ => Value::Array(
            texts(&format!("{at}.content"), content)?
                .into_iter()
                .map(text_block)
                .collect(),
        ),
    };
    Ok(Content::Blocks(vec![
        json!({"type": "tool_result", "tool_use_id": id, "content": content}),
    ]))
}
