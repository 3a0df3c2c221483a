//! GGUF metadata as the spec functions read it: typed getters that accept every integer
//! width a converter may have written, and a record of what was read, so that a key of
//! the architecture's namespace which no spec function applies refuses the file instead
//! of being ignored (a key that changes the maths must never be silently dropped).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use candle_core::quantized::gguf_file::{TensorInfo, Value};

use crate::error::{LoadError, Unapplied};

/// One GGUF file's metadata and tensor index, seen through `{arch}.` keys.
pub struct GgufMeta<'a> {
    file: &'a str,
    arch: &'a str,
    metadata: &'a HashMap<String, Value>,
    tensors: &'a HashMap<String, TensorInfo>,
    read: RefCell<BTreeSet<String>>,
}

impl<'a> GgufMeta<'a> {
    pub fn new(
        file: &'a str,
        arch: &'a str,
        metadata: &'a HashMap<String, Value>,
        tensors: &'a HashMap<String, TensorInfo>,
    ) -> Self {
        GgufMeta {
            file,
            arch,
            metadata,
            tensors,
            read: RefCell::new(BTreeSet::new()),
        }
    }

    pub fn file(&self) -> &str {
        self.file
    }

    fn full(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// The raw value of `{arch}.{key}`, recorded as read.
    fn get(&self, key: &str) -> Option<&'a Value> {
        let full = self.full(key);
        let v = self.metadata.get(&full);
        self.read.borrow_mut().insert(full);
        v
    }

    pub fn error(&self, key: &str, problem: impl Into<String>) -> LoadError {
        LoadError::Metadata {
            file: self.file.to_string(),
            key: self.full(key),
            problem: problem.into(),
        }
    }

    /// A count; per-layer arrays are accepted when every layer has the same value.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, LoadError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Value::Array(items) = v {
            let values = items
                .iter()
                .map(|v| integer(v).ok_or_else(|| self.error(key, "is not an array of integers")))
                .collect::<Result<BTreeSet<_>, _>>()?;
            return match values.len() {
                1 => Ok(values.first().copied()),
                0 => Err(self.error(key, "is an empty array")),
                _ => Err(self.error(
                    key,
                    "differs between layers, which Sonde's forward pass does not implement",
                )),
            };
        }
        integer(v)
            .map(Some)
            .ok_or_else(|| self.error(key, format!("is {v:?}, not a non-negative integer")))
    }

    pub fn usize(&self, key: &str) -> Result<usize, LoadError> {
        self.opt_usize(key)?
            .ok_or_else(|| self.error(key, "is missing"))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(f64::from(*v))),
            Some(Value::F64(v)) => Ok(Some(*v)),
            Some(v) => integer(v)
                .map(|i| Some(i as f64))
                .ok_or_else(|| self.error(key, format!("is {v:?}, not a number"))),
        }
    }

    pub fn f64(&self, key: &str) -> Result<f64, LoadError> {
        self.opt_f64(key)?
            .ok_or_else(|| self.error(key, "is missing"))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.error(key, format!("is {v:?}, not a string"))),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.error(key, format!("is {v:?}, not a boolean"))),
        }
    }

    /// A per-layer array of booleans (e.g. `attention.sliding_window_pattern`), or the
    /// integer form some converters write instead.
    pub fn opt_bools_or_usize(&self, key: &str) -> Result<Option<BoolsOrCount>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    _ => Err(self.error(key, "is not an array of booleans")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|v| Some(BoolsOrCount::Bools(v))),
            Some(v) => integer(v)
                .map(|n| Some(BoolsOrCount::Count(n)))
                .ok_or_else(|| self.error(key, format!("is {v:?}, not booleans or a count"))),
        }
    }

    /// Keys that do not change the maths (or are checked elsewhere): read, so
    /// [`GgufMeta::finish`] accepts them.
    pub fn accept(&self, keys: &[&str]) {
        let mut read = self.read.borrow_mut();
        for k in keys {
            read.insert(self.full(k));
        }
    }

    /// A key that must hold `expected` if present (e.g. `expert_count` 0).
    pub fn expect_usize(&self, key: &str, expected: usize, what: &str) -> Result<(), LoadError> {
        match self.opt_usize(key)? {
            Some(v) if v != expected => Err(self.error(key, format!("is {v}; {what}"))),
            _ => Ok(()),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn tensor_rows(&self, name: &str) -> Option<usize> {
        self.tensors
            .get(name)
            .and_then(|t| t.shape.dims().first().copied())
    }

    /// Fails on the first `{arch}.` key no spec function read: the file asks for
    /// something this forward pass does not do.
    pub fn finish(&self) -> Result<(), LoadError> {
        let prefix = format!("{}.", self.arch);
        let read = self.read.borrow();
        let mut keys: Vec<&String> = self.metadata.keys().collect();
        keys.sort();
        match keys
            .into_iter()
            .find(|k| k.starts_with(&prefix) && !read.contains(*k))
        {
            Some(key) => Err(LoadError::NotApplied {
                file: self.file.to_string(),
                what: Unapplied::Metadata(key.clone()),
                architecture: self.arch.to_string(),
            }),
            None => Ok(()),
        }
    }
}

pub enum BoolsOrCount {
    Bools(Vec<bool>),
    Count(usize),
}

fn integer(v: &Value) -> Option<usize> {
    let i: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        _ => return None,
    };
    usize::try_from(i).ok()
}
