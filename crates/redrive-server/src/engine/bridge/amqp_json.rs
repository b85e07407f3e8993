//! AMQP properties and header tables as plain JSON, and back, exactly (SPEC §11: what the
//! RabbitMQ bridge keeps is readable *and* exact).
//!
//! A header value is kept as the JSON value it means: a string as a string, an integer as a
//! number, a boolean, a nested table as an object, an array as an array, void as `null`.
//! JSON alone cannot say which AMQP type a value had (a 32-bit `I` and a 64-bit `l`
//! integer are both numbers), so a second JSON document of the same shape, the *types*,
//! names the type of every value whose type is not the default of its JSON form. It is
//! absent when every value has its default type (the common case: strings, 64-bit
//! integers, booleans, doubles, tables, arrays).
//!
//! | AMQP type | JSON value | in the types |
//! |---|---|---|
//! | `S` long string, UTF-8 | string | — |
//! | `S` long string, other bytes | base64 string | `"LongString(base64)"` |
//! | short string (never sent by RabbitMQ) | string | `"ShortString"` |
//! | `t` boolean | boolean | — |
//! | `l` 64-bit integer | number | — |
//! | `b` `B` `s` `u` `I` `i` smaller integers | number | `"ShortShortInt"`, `"ShortShortUInt"`, `"ShortInt"`, `"ShortUInt"`, `"LongInt"`, `"LongUInt"` |
//! | `d` double | number (`"NaN"`, `"inf"`, `"-inf"` and numbers JSON would round as strings) | — (`"Double"` when a string) |
//! | `f` float | number (or a string, as a double) | `"Float"` |
//! | `D` decimal | string, `"12.34"` (scale = digits after the point) | `"DecimalValue"` |
//! | `T` timestamp | number (seconds) | `"Timestamp"` |
//! | `x` byte array | base64 string | `"ByteArray"` |
//! | `V` void | `null` | — |
//! | `A` array | array | an object of its elements' types by index, when one is listed |
//! | `F` table | object | an object of its entries' types, when one is listed |
//!
//! The properties other than `headers` are plain too (`{"content_type": "application/json",
//! "delivery_mode": 2, "type": "order.paid"}`: AMQP's names, `type` for the property lapin
//! calls `kind`), absent ones left out. Messages stored before this form kept lapin's own
//! serialization of every property in one document (`{"LongString": [97, …]}` for a
//! string); [`properties_from_json`] still reads it.

use super::{base64_decode, base64_encode};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::BasicProperties;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The properties of a message, without its headers, as plain JSON.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Plain {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery_mode: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    priority: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expiration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
    #[serde(
        default,
        rename = "type",
        alias = "kind",
        skip_serializing_if = "Option::is_none"
    )]
    kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    app_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<String>,
}

/// A message's properties as the bridge stores them.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredProperties {
    /// Every property but the headers (header `amqp-properties`).
    pub properties: String,
    /// The header table as plain JSON, when there is one (header `amqp-headers`).
    pub headers: Option<String>,
    /// The types plain JSON does not tell, when there are any (header `amqp-header-types`).
    pub types: Option<String>,
}

/// `props` as plain JSON: [`StoredProperties`].
pub fn properties_to_json(props: &BasicProperties) -> StoredProperties {
    let s = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
    let plain = Plain {
        content_type: s(props.content_type()),
        content_encoding: s(props.content_encoding()),
        delivery_mode: *props.delivery_mode(),
        priority: *props.priority(),
        correlation_id: s(props.correlation_id()),
        reply_to: s(props.reply_to()),
        expiration: s(props.expiration()),
        message_id: s(props.message_id()),
        timestamp: *props.timestamp(),
        kind: s(props.kind()),
        user_id: s(props.user_id()),
        app_id: s(props.app_id()),
        cluster_id: s(props.cluster_id()),
    };
    let (headers, types) = match props.headers() {
        // An empty table is kept as none: a republish adds its own headers anyway.
        Some(table) if !table.inner().is_empty() => {
            let (value, types) = table_to_json(table);
            (
                Some(Value::Object(value).to_string()),
                types.map(|t| t.to_string()),
            )
        }
        _ => (None, None),
    };
    StoredProperties {
        properties: serde_json::to_string(&plain).unwrap_or_else(|_| "{}".to_owned()),
        headers,
        types,
    }
}

/// The properties [`properties_to_json`] stored (or lapin's own serialization of them, in
/// `properties` alone, for a message stored before the plain form).
pub fn properties_from_json(
    properties: &str,
    headers: Option<&str>,
    types: Option<&str>,
) -> Result<BasicProperties, String> {
    let doc: Value = serde_json::from_str(properties)
        .map_err(|e| format!("header amqp-properties is not JSON: {e}"))?;
    if doc.get("headers").is_some() {
        // The form before plain JSON: lapin's serialization, headers included.
        return serde_json::from_value(doc).map_err(|e| format!("header amqp-properties: {e}"));
    }
    let p: Plain =
        serde_json::from_value(doc).map_err(|e| format!("header amqp-properties: {e}"))?;
    let mut props = BasicProperties::default();
    let short = |s: String| ShortString::from(s);
    if let Some(v) = p.content_type {
        props = props.with_content_type(short(v));
    }
    if let Some(v) = p.content_encoding {
        props = props.with_content_encoding(short(v));
    }
    if let Some(v) = p.delivery_mode {
        props = props.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        props = props.with_priority(v);
    }
    if let Some(v) = p.correlation_id {
        props = props.with_correlation_id(short(v));
    }
    if let Some(v) = p.reply_to {
        props = props.with_reply_to(short(v));
    }
    if let Some(v) = p.expiration {
        props = props.with_expiration(short(v));
    }
    if let Some(v) = p.message_id {
        props = props.with_message_id(short(v));
    }
    if let Some(v) = p.timestamp {
        props = props.with_timestamp(v);
    }
    if let Some(v) = p.kind {
        props = props.with_type(short(v));
    }
    if let Some(v) = p.user_id {
        props = props.with_user_id(short(v));
    }
    if let Some(v) = p.app_id {
        props = props.with_app_id(short(v));
    }
    if let Some(v) = p.cluster_id {
        props = props.with_cluster_id(short(v));
    }
    let Some(h) = headers else {
        return Ok(props);
    };
    {
        let value: Value =
            serde_json::from_str(h).map_err(|e| format!("header amqp-headers is not JSON: {e}"))?;
        let types: Option<Value> = types
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("header amqp-header-types is not JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err("header amqp-headers is not a JSON object".to_owned());
        };
        props = props.with_headers(table_from_json(&map, types.as_ref())?);
    }
    Ok(props)
}

/// A header table as a JSON object, and the types it does not tell (`None`: none).
pub fn table_to_json(table: &FieldTable) -> (Map<String, Value>, Option<Value>) {
    let mut out = Map::new();
    let mut types = Map::new();
    for (k, v) in table.inner() {
        let (value, ty) = value_to_json(v);
        out.insert(k.as_str().to_owned(), value);
        if let Some(t) = ty {
            types.insert(k.as_str().to_owned(), t);
        }
    }
    (out, (!types.is_empty()).then_some(Value::Object(types)))
}

/// A JSON object and its types back to a header table.
pub fn table_from_json(
    map: &Map<String, Value>,
    types: Option<&Value>,
) -> Result<FieldTable, String> {
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let ty = types.and_then(|t| t.get(k));
        out.insert(
            ShortString::from(k.clone()),
            value_from_json(v, ty).map_err(|e| format!("header {k}: {e}"))?,
        );
    }
    Ok(FieldTable::from(out))
}

/// A JSON number from a double, when JSON text gives that very double back; else `None`
/// (non-finite, or one serde_json's default parsing would round differently).
fn exact_number(x: f64) -> Option<Value> {
    let v = serde_json::Number::from_f64(x)?;
    let back: f64 = serde_json::from_str(&v.to_string()).ok()?;
    (back.to_bits() == x.to_bits()).then_some(Value::Number(v))
}

/// A double that JSON cannot carry as a number, as text Rust parses back exactly.
fn double_text(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{x:?}")
    }
}

fn parse_double(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .map_err(|_| format!("{text:?} is not a number"))
}

fn decimal_text(d: &DecimalValue) -> String {
    let digits = d.value.to_string();
    let scale = usize::from(d.scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

fn parse_decimal(text: &str) -> Result<DecimalValue, String> {
    let bad = || format!("{text:?} is not a decimal such as \"12.34\"");
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let scale = u8::try_from(frac.len()).map_err(|_| bad())?;
    let value = format!("{int}{frac}").parse::<u32>().map_err(|_| bad())?;
    Ok(DecimalValue { scale, value })
}

fn tag(name: &str) -> Option<Value> {
    Some(Value::String(name.to_owned()))
}

/// One value as JSON, and its type when not the default of that JSON.
fn value_to_json(v: &AMQPValue) -> (Value, Option<Value>) {
    match v {
        AMQPValue::Boolean(b) => (Value::Bool(*b), None),
        AMQPValue::ShortShortInt(n) => (Value::from(*n), tag("ShortShortInt")),
        AMQPValue::ShortShortUInt(n) => (Value::from(*n), tag("ShortShortUInt")),
        AMQPValue::ShortInt(n) => (Value::from(*n), tag("ShortInt")),
        AMQPValue::ShortUInt(n) => (Value::from(*n), tag("ShortUInt")),
        AMQPValue::LongInt(n) => (Value::from(*n), tag("LongInt")),
        AMQPValue::LongUInt(n) => (Value::from(*n), tag("LongUInt")),
        AMQPValue::LongLongInt(n) => (Value::from(*n), None),
        AMQPValue::Float(x) => match exact_number(f64::from(*x)) {
            Some(n) => (n, tag("Float")),
            None => (Value::String(double_text(f64::from(*x))), tag("Float")),
        },
        AMQPValue::Double(x) => match exact_number(*x) {
            Some(n) => (n, None),
            None => (Value::String(double_text(*x)), tag("Double")),
        },
        AMQPValue::DecimalValue(d) => (Value::String(decimal_text(d)), tag("DecimalValue")),
        AMQPValue::ShortString(s) => (Value::String(s.as_str().to_owned()), tag("ShortString")),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(t) => (Value::String(t.to_owned()), None),
            Err(_) => (
                Value::String(base64_encode(s.as_bytes())),
                tag("LongString(base64)"),
            ),
        },
        AMQPValue::FieldArray(a) => {
            let mut items = Vec::with_capacity(a.as_slice().len());
            let mut types = Map::new();
            for (i, item) in a.as_slice().iter().enumerate() {
                let (value, ty) = value_to_json(item);
                items.push(value);
                if let Some(t) = ty {
                    types.insert(i.to_string(), t);
                }
            }
            (
                Value::Array(items),
                (!types.is_empty()).then_some(Value::Object(types)),
            )
        }
        AMQPValue::Timestamp(t) => (Value::from(*t), tag("Timestamp")),
        AMQPValue::FieldTable(t) => {
            let (value, types) = table_to_json(t);
            (Value::Object(value), types)
        }
        AMQPValue::ByteArray(b) => (Value::String(base64_encode(b.as_slice())), tag("ByteArray")),
        AMQPValue::Void => (Value::Null, None),
    }
}

/// One JSON value back to AMQP, by its type (`ty`: from the types document, if listed).
fn value_from_json(v: &Value, ty: Option<&Value>) -> Result<AMQPValue, String> {
    let name = ty.and_then(Value::as_str);
    let int = |v: &Value| -> Result<i64, String> {
        v.as_i64()
            .ok_or_else(|| format!("{v} is not an integer for its type {}", name.unwrap_or("")))
    };
    let narrow = |n: i64| -> String { format!("{n} is out of range for {}", name.unwrap_or("")) };
    let double = |v: &Value| -> Result<f64, String> {
        match v {
            Value::Number(n) => n.as_f64().ok_or_else(|| format!("{v} is not a number")),
            Value::String(s) => parse_double(s),
            _ => Err(format!("{v} is not a number")),
        }
    };
    let text = |v: &Value| -> Result<String, String> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{v} is not a string for its type {}", name.unwrap_or("")))
    };
    Ok(match (name, v) {
        (Some("ShortShortInt"), _) => {
            let n = int(v)?;
            AMQPValue::ShortShortInt(i8::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("ShortShortUInt"), _) => {
            let n = int(v)?;
            AMQPValue::ShortShortUInt(u8::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("ShortInt"), _) => {
            let n = int(v)?;
            AMQPValue::ShortInt(i16::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("ShortUInt"), _) => {
            let n = int(v)?;
            AMQPValue::ShortUInt(u16::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("LongInt"), _) => {
            let n = int(v)?;
            AMQPValue::LongInt(i32::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("LongUInt"), _) => {
            let n = int(v)?;
            AMQPValue::LongUInt(u32::try_from(n).map_err(|_| narrow(n))?)
        }
        (Some("Timestamp"), _) => AMQPValue::Timestamp(
            v.as_u64()
                .ok_or_else(|| format!("{v} is not a timestamp (seconds)"))?,
        ),
        (Some("Float"), _) => AMQPValue::Float(double(v)? as f32),
        (Some("Double"), _) => AMQPValue::Double(double(v)?),
        (Some("DecimalValue"), _) => AMQPValue::DecimalValue(parse_decimal(&text(v)?)?),
        (Some("ShortString"), _) => AMQPValue::ShortString(ShortString::from(text(v)?)),
        (Some("LongString(base64)"), _) => AMQPValue::LongString(LongString::from(
            base64_decode(&text(v)?).ok_or("not base64")?,
        )),
        (Some("ByteArray"), _) => AMQPValue::ByteArray(ByteArray::from(
            base64_decode(&text(v)?).ok_or("not base64")?,
        )),
        (Some(other), _) => return Err(format!("unknown AMQP type {other:?}")),
        (None, Value::Null) => AMQPValue::Void,
        (None, Value::Bool(b)) => AMQPValue::Boolean(*b),
        (None, Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            // Above i64::MAX: RabbitMQ has no unsigned 64-bit type; a double keeps it close.
            (None, Some(u)) => AMQPValue::Double(u as f64),
            (None, None) => AMQPValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        (None, Value::String(s)) => AMQPValue::LongString(LongString::from(s.clone().into_bytes())),
        (None, Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let ty = ty.and_then(|t| t.get(i.to_string()));
                out.push(value_from_json(item, ty).map_err(|e| format!("[{i}]: {e}"))?);
            }
            AMQPValue::FieldArray(FieldArray::from(out))
        }
        (None, Value::Object(map)) => AMQPValue::FieldTable(table_from_json(map, ty)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
        FieldTable::from(
            entries
                .into_iter()
                .map(|(k, v)| (ShortString::from(k), v))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    /// Every AMQP type RabbitMQ sends, nested in tables and arrays.
    fn every_type() -> FieldTable {
        let nested = table(vec![
            ("count", AMQPValue::LongInt(7)),
            (
                "name",
                AMQPValue::LongString(LongString::from(b"x".to_vec())),
            ),
        ]);
        table(vec![
            (
                "tenant",
                AMQPValue::LongString(LongString::from(b"acme".to_vec())),
            ),
            (
                "binary",
                AMQPValue::LongString(LongString::from(vec![0xff, 0x00, 0x41])),
            ),
            ("flag", AMQPValue::Boolean(true)),
            ("i8", AMQPValue::ShortShortInt(-8)),
            ("u8", AMQPValue::ShortShortUInt(200)),
            ("i16", AMQPValue::ShortInt(-1600)),
            ("u16", AMQPValue::ShortUInt(60_000)),
            ("i32", AMQPValue::LongInt(-70_000)),
            ("u32", AMQPValue::LongUInt(4_000_000_000)),
            ("i64", AMQPValue::LongLongInt(-9_000_000_000)),
            ("f32", AMQPValue::Float(0.1)),
            ("f64", AMQPValue::Double(2.5)),
            ("f64_whole", AMQPValue::Double(2.0)),
            ("nan", AMQPValue::Double(f64::NAN)),
            ("inf", AMQPValue::Double(f64::NEG_INFINITY)),
            (
                "decimal",
                AMQPValue::DecimalValue(DecimalValue { scale: 3, value: 5 }),
            ),
            ("short", AMQPValue::ShortString(ShortString::from("s"))),
            ("at", AMQPValue::Timestamp(1_700_000_000)),
            (
                "bytes",
                AMQPValue::ByteArray(ByteArray::from(vec![1u8, 2, 255])),
            ),
            ("void", AMQPValue::Void),
            ("table", AMQPValue::FieldTable(nested.clone())),
            (
                "list",
                AMQPValue::FieldArray(FieldArray::from(vec![
                    AMQPValue::LongLongInt(1),
                    AMQPValue::ShortInt(2),
                    AMQPValue::LongString(LongString::from(b"three".to_vec())),
                    AMQPValue::FieldTable(nested),
                ])),
            ),
        ])
    }

    #[test]
    fn header_values_are_plain_json() {
        let (value, types) = table_to_json(&every_type());
        let value = Value::Object(value);
        assert_eq!(value["tenant"], json!("acme"));
        assert_eq!(value["flag"], json!(true));
        assert_eq!(value["i32"], json!(-70_000));
        assert_eq!(value["i64"], json!(-9_000_000_000i64));
        assert_eq!(value["f64"], json!(2.5));
        assert_eq!(value["decimal"], json!("0.005"));
        assert_eq!(value["void"], json!(null));
        assert_eq!(value["table"], json!({"count": 7, "name": "x"}));
        assert_eq!(
            value["list"],
            json!([1, 2, "three", {"count": 7, "name": "x"}])
        );
        assert_eq!(value["nan"], json!("NaN"));
        // Only what plain JSON cannot tell is listed, in the same shape.
        let types = types.expect("types");
        assert_eq!(types["i32"], json!("LongInt"));
        assert_eq!(types["table"], json!({"count": "LongInt"}));
        assert_eq!(
            types["list"],
            json!({"1": "ShortInt", "3": {"count": "LongInt"}})
        );
        assert_eq!(types["binary"], json!("LongString(base64)"));
        for default in ["tenant", "flag", "i64", "f64", "f64_whole", "void"] {
            assert!(types.get(default).is_none(), "{default}: {types}");
        }
        assert!(!value.to_string().contains("LongString\":"), "{value}");
    }

    #[test]
    fn every_type_comes_back_exactly() {
        let original = every_type();
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_priority(3)
            .with_message_id(ShortString::from("m-1"))
            .with_timestamp(1_700_000_000)
            .with_type(ShortString::from("order.paid"))
            .with_app_id(ShortString::from("shop"))
            .with_headers(original.clone());
        let stored = properties_to_json(&props);
        let plain: Value = serde_json::from_str(&stored.properties).unwrap();
        assert_eq!(
            plain,
            json!({"content_type": "application/json", "delivery_mode": 2, "priority": 3,
                   "message_id": "m-1", "timestamp": 1_700_000_000, "type": "order.paid",
                   "app_id": "shop"})
        );
        let back = properties_from_json(
            &stored.properties,
            stored.headers.as_deref(),
            stored.types.as_deref(),
        )
        .unwrap();
        // NaN is not equal to itself: compare the wire form.
        let wire = |p: &BasicProperties| format!("{p:?}");
        assert_eq!(wire(&back), wire(&props));
        let get = |p: &BasicProperties, k: &str| p.headers().as_ref().unwrap().inner()[k].clone();
        for k in [
            "i8", "u8", "i16", "u16", "i32", "u32", "f32", "decimal", "at", "bytes",
        ] {
            assert_eq!(get(&back, k).get_type(), get(&props, k).get_type(), "{k}");
        }
        assert!(matches!(get(&back, "nan"), AMQPValue::Double(x) if x.is_nan()));
        assert!(matches!(get(&back, "f32"), AMQPValue::Float(x) if x == 0.1f32));
    }

    #[test]
    fn no_headers_no_types() {
        let stored = properties_to_json(&BasicProperties::default());
        assert_eq!(stored.properties, "{}");
        assert_eq!(stored.headers, None);
        let plain = properties_to_json(&BasicProperties::default().with_headers(table(vec![(
            "tenant",
            AMQPValue::LongString(LongString::from(b"acme".to_vec())),
        )])));
        assert_eq!(plain.headers.as_deref(), Some(r#"{"tenant":"acme"}"#));
        assert_eq!(plain.types, None);
    }

    /// A message stored before the plain form kept lapin's serialization: still read.
    #[test]
    fn the_form_before_plain_json_is_still_read() {
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("text/plain"))
            .with_headers(table(vec![(
                "tenant",
                AMQPValue::LongString(LongString::from(b"t1".to_vec())),
            )]));
        let legacy = serde_json::to_string(&props).unwrap();
        assert!(legacy.contains("LongString"), "{legacy}");
        let back = properties_from_json(&legacy, None, None).unwrap();
        assert_eq!(back, props);
        let no_headers =
            serde_json::to_string(&BasicProperties::default().with_type(ShortString::from("k")))
                .unwrap();
        assert_eq!(
            properties_from_json(&no_headers, None, None)
                .unwrap()
                .kind(),
            &Some(ShortString::from("k"))
        );
    }

    #[test]
    fn decimals_keep_their_scale() {
        for (scale, value, text) in [
            (0u8, 1234u32, "1234"),
            (2, 1234, "12.34"),
            (3, 5, "0.005"),
            (2, 0, "0.00"),
        ] {
            let d = DecimalValue { scale, value };
            assert_eq!(decimal_text(&d), text);
            assert_eq!(parse_decimal(text).unwrap(), d, "{text}");
        }
        assert!(parse_decimal("1.2.3").is_err());
        assert!(parse_decimal("-1").is_err());
    }

    #[test]
    fn a_wrong_value_for_its_type_is_an_error_not_a_guess() {
        let map = json!({"n": "seven"}).as_object().unwrap().clone();
        let types = json!({"n": "LongInt"});
        assert!(table_from_json(&map, Some(&types)).is_err());
        let map = json!({"n": 70000}).as_object().unwrap().clone();
        let types = json!({"n": "ShortInt"});
        let e = table_from_json(&map, Some(&types)).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }
}
