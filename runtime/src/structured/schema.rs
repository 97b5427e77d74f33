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
    pub fn from_json(schema: &Value) -> Result<FlatSchema, SchemaError> {
        let obj = schema.as_object().ok_or(SchemaError::NotAnObject)?;
        if let Some(t) = obj.get("type")
            && t != "object"
        {
            return Err(SchemaError::NotObjectType(t.to_string()));
        }
        let props = match obj.get("properties") {
            Some(Value::Object(p)) if !p.is_empty() => p,
            Some(Value::Object(_)) | None => return Err(SchemaError::NoProperties),
            Some(_) => return Err(SchemaError::PropertiesNotAnObject),
        };
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(SchemaError::RequiredNotAList),
        };
        let mut fields = Vec::with_capacity(props.len());
        for (name, prop) in props {
            let ty = field_type(prop).map_err(|why| SchemaError::Property { name: name.clone(), why })?;
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

/// Why a JSON schema is not bindable: the schema itself, or one of its properties.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("the schema is not a JSON object")]
    NotAnObject,
    /// The `type` it has instead, as JSON.
    #[error("`type` is {0}, not \"object\"")]
    NotObjectType(String),
    #[error("it has no `properties` (an empty object is not bindable)")]
    NoProperties,
    #[error("`properties` is not an object")]
    PropertiesNotAnObject,
    #[error("`required` is not a list of names")]
    RequiredNotAList,
    #[error("property `{name}` {why}")]
    Property { name: String, why: PropertyError },
}

/// Why one property cannot be a flat field (said after its name: "property `x` is a nested
/// object").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PropertyError {
    #[error("is not a schema object")]
    NotASchema,
    #[error("has an `enum` that is not a list")]
    EnumNotAList,
    #[error("has an `enum` that is not a non-empty list of scalars")]
    EnumNotScalars,
    #[error("is a nested object")]
    NestedObject,
    /// The type it names instead.
    #[error("has type `{0}`, which is not a scalar")]
    NotAScalar(String),
    #[error("has no scalar `type`")]
    NoType,
    /// An array whose items cannot be a scalar, and why.
    #[error("is an array whose items {0}")]
    Items(Box<PropertyError>),
}

fn scalar(prop: &Value) -> Result<Scalar, PropertyError> {
    let obj = prop.as_object().ok_or(PropertyError::NotASchema)?;
    if let Some(values) = obj.get("enum") {
        let values = values.as_array().ok_or(PropertyError::EnumNotAList)?;
        if values.is_empty() || values.iter().any(|v| v.is_object() || v.is_array()) {
            return Err(PropertyError::EnumNotScalars);
        }
        return Ok(Scalar::Enum(values.clone()));
    }
    match obj.get("type").and_then(Value::as_str) {
        Some("string") => Ok(Scalar::String),
        Some("integer") => Ok(Scalar::Integer),
        Some("number") => Ok(Scalar::Number),
        Some("boolean") => Ok(Scalar::Boolean),
        Some("object") => Err(PropertyError::NestedObject),
        Some(other) => Err(PropertyError::NotAScalar(other.to_owned())),
        None => Err(PropertyError::NoType),
    }
}

fn field_type(prop: &Value) -> Result<FieldType, PropertyError> {
    if prop.get("type").and_then(Value::as_str) == Some("array") && prop.get("enum").is_none() {
        // The reference defaults missing `items` to strings.
        let items = match prop.get("items") {
            None => Scalar::String,
            Some(items) => scalar(items).map_err(|why| PropertyError::Items(Box::new(why)))?,
        };
        return Ok(FieldType::Array(items));
    }
    scalar(prop).map(FieldType::Scalar)
}
