//! Metadata values (GGUF spec: `gguf_metadata_value_type`).

/// GGUF metadata value type ids.
pub mod ty {
    #![allow(missing_docs)]
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value. Arrays are homogeneous and may nest.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A homogeneous array; `elem_type` is the GGUF type id of its elements.
    Array { elem_type: u32, items: Vec<Value> },
}

impl Value {
    /// The GGUF type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => ty::U8,
            Value::I8(_) => ty::I8,
            Value::U16(_) => ty::U16,
            Value::I16(_) => ty::I16,
            Value::U32(_) => ty::U32,
            Value::I32(_) => ty::I32,
            Value::F32(_) => ty::F32,
            Value::Bool(_) => ty::BOOL,
            Value::String(_) => ty::STRING,
            Value::U64(_) => ty::U64,
            Value::I64(_) => ty::I64,
            Value::F64(_) => ty::F64,
            Value::Array { .. } => ty::ARRAY,
        }
    }

    /// Any integer value as `i128` (lossless), else `None`.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// A float or integer value as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array { items, .. } => Some(items),
            _ => None,
        }
    }

    /// A short human-readable rendering: long arrays and strings are summarised.
    pub fn summary(&self, max_items: usize) -> String {
        match self {
            Value::String(s) => {
                let mut t: String = s.chars().take(80).collect();
                if t.len() < s.len() {
                    t.push_str(&format!("… ({} bytes)", s.len()));
                }
                format!("{t:?}")
            }
            Value::Array { elem_type, items } => {
                let shown: Vec<String> =
                    items.iter().take(max_items).map(|v| v.summary(max_items)).collect();
                let more = if items.len() > max_items {
                    format!(", … ({} items of {})", items.len(), type_name(*elem_type))
                } else {
                    String::new()
                };
                format!("[{}{more}]", shown.join(", "))
            }
            Value::Bool(b) => b.to_string(),
            Value::F32(v) => v.to_string(),
            Value::F64(v) => v.to_string(),
            other => other.as_int().map(|i| i.to_string()).unwrap_or_default(),
        }
    }

    /// Convert to JSON (for `hearth inspect --json`).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::String(s) => J::String(s.clone()),
            Value::Bool(b) => J::Bool(*b),
            Value::F32(v) => serde_json::Number::from_f64(*v as f64).map(J::Number).unwrap_or(J::Null),
            Value::F64(v) => serde_json::Number::from_f64(*v).map(J::Number).unwrap_or(J::Null),
            Value::Array { items, .. } => J::Array(items.iter().map(Value::to_json).collect()),
            Value::U64(v) => J::from(*v),
            Value::I64(v) => J::from(*v),
            other => J::from(other.as_int().unwrap_or(0) as i64),
        }
    }
}

/// The spec's name of a metadata type id.
pub fn type_name(id: u32) -> &'static str {
    match id {
        ty::U8 => "uint8",
        ty::I8 => "int8",
        ty::U16 => "uint16",
        ty::I16 => "int16",
        ty::U32 => "uint32",
        ty::I32 => "int32",
        ty::F32 => "float32",
        ty::BOOL => "bool",
        ty::STRING => "string",
        ty::ARRAY => "array",
        ty::U64 => "uint64",
        ty::I64 => "int64",
        ty::F64 => "float64",
        _ => "unknown",
    }
}
