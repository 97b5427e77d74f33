//! Bindable output schemas: the flat JSON Schemas a stage can ask a provider for natively.

use serde_json::Value;

/// A scalar field type of a bindable schema.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    String,
    Integer,
    Number,
    Boolean,
    /// `enum`: the value must equal one of these (a `Literal[...]` in the reference).
    Enum(Vec<Value>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum FieldType {
    Scalar(Scalar),
    Array(Scalar),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Private, with `name_json` made from it: the two cannot differ.
    name: String,
    pub ty: FieldType,
    pub required: bool,
    /// The name as a JSON string (`"name"`), written into every reply's serialisation.
    name_json: String,
}

impl Field {
    pub fn new(name: String, ty: FieldType, required: bool) -> Field {
        let mut name_json = String::with_capacity(name.len() + 2);
        super::push_json_string(&mut name_json, &name);
        Field { name, ty, required, name_json }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as a JSON string, quotes and escapes included.
    pub fn name_json(&self) -> &str {
        &self.name_json
    }
}

/// A validated flat object schema. Field order is the order of `properties`, which is also the
/// key order of the serialised result.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatSchema {
    fields: Vec<Field>,
    /// The schema as written, for providers' native structured output.
    source: Value,
    text_envelope: bool,
}

impl FlatSchema {
    /// Checks that `schema` is bindable; the error says why not.
    pub fn from_json(schema: &Value) -> Result<FlatSchema, String> {
        let obj = schema.as_object().ok_or("the schema is not a JSON object")?;
        if let Some(t) = obj.get("type")
            && t != "object"
        {
            return Err(format!("`type` is {t}, not \"object\""));
        }
        let props = match obj.get("properties") {
            Some(Value::Object(p)) if !p.is_empty() => p,
            Some(Value::Object(_)) | None => return Err("it has no `properties` (an empty object is not bindable)".into()),
            Some(_) => return Err("`properties` is not an object".into()),
        };
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err("`required` is not a list of names".into()),
        };
        let mut fields = Vec::with_capacity(props.len());
        for (name, prop) in props {
            let ty = field_type(prop).map_err(|why| format!("property `{name}` {why}"))?;
            // Pydantic makes a name with a leading underscore a private attribute: never
            // validated, never in the output, required or not (found by python/tests/test_parity.py).
            if name.starts_with('_') {
                continue;
            }
            fields.push(Field::new(name.clone(), ty, required.contains(&name.as_str())));
        }
        let text_envelope = props.keys().all(|name| name == "text" || name == "message");
        Ok(FlatSchema { fields, source: schema.clone(), text_envelope })
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    pub fn source(&self) -> &Value {
        &self.source
    }

    /// True when the properties are a subset of `{text, message}`: prose stays prose.
    pub fn is_text_envelope(&self) -> bool {
        self.text_envelope
    }
}

fn scalar(prop: &Value) -> Result<Scalar, String> {
    let obj = prop.as_object().ok_or("is not a schema object")?;
    if let Some(values) = obj.get("enum") {
        let values = values.as_array().ok_or("has an `enum` that is not a list")?;
        if values.is_empty() || values.iter().any(|v| v.is_object() || v.is_array()) {
            return Err("has an `enum` that is not a non-empty list of scalars".into());
        }
        return Ok(Scalar::Enum(values.clone()));
    }
    match obj.get("type").and_then(Value::as_str) {
        Some("string") => Ok(Scalar::String),
        Some("integer") => Ok(Scalar::Integer),
        Some("number") => Ok(Scalar::Number),
        Some("boolean") => Ok(Scalar::Boolean),
        Some("object") => Err("is a nested object".into()),
        Some(other) => Err(format!("has type `{other}`, which is not a scalar")),
        None => Err("has no scalar `type`".into()),
    }
}

fn field_type(prop: &Value) -> Result<FieldType, String> {
    if prop.get("type").and_then(Value::as_str) == Some("array") && prop.get("enum").is_none() {
        // The reference defaults missing `items` to strings.
        let items = match prop.get("items") {
            None => Scalar::String,
            Some(items) => scalar(items).map_err(|why| format!("is an array whose items {why}"))?,
        };
        return Ok(FieldType::Array(items));
    }
    scalar(prop).map(FieldType::Scalar)
}
