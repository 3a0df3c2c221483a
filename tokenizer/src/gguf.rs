//! A reader for the metadata section of a GGUF file (versions 2 and 3).
//!
//! The router needs the tokenizer and chat template that a GGUF file carries in its
//! metadata, but none of its tensors; reading only the header keeps the router free of
//! candle and reads a few megabytes of a file that may hold gigabytes of weights.
//! Layout: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::TokenizerError;

const MAGIC: &[u8; 4] = b"GGUF";
/// Upper bound for one string or array length: a corrupt length must fail cleanly
/// instead of asking the allocator for exabytes.
const MAX_LEN: u64 = 1 << 30;

/// One metadata value. Arrays keep their element values; the tokenizer arrays (up to a
/// few hundred thousand strings) fit comfortably.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, whatever integer type the writer chose.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// The key/value metadata of a GGUF file.
#[derive(Debug, Clone, Default)]
pub struct GgufMetadata {
    pub version: u32,
    pub tensor_count: u64,
    pub kv: HashMap<String, Value>,
}

impl GgufMetadata {
    /// Reads the metadata of the GGUF file at `path`, stopping before the tensor infos.
    pub fn read_file(path: &Path) -> Result<Self, TokenizerError> {
        let file = File::open(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::read(&mut BufReader::new(file)).map_err(|err| match err {
            TokenizerError::Gguf(msg) => TokenizerError::Gguf(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Reads GGUF metadata from any reader positioned at the start of the file.
    pub fn read<R: Read>(reader: &mut R) -> Result<Self, TokenizerError> {
        let mut r = Reader { inner: reader };
        let mut magic = [0u8; 4];
        r.fill(&mut magic)?;
        if &magic != MAGIC {
            return Err(TokenizerError::Gguf(format!(
                "not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"
            )));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(TokenizerError::Gguf(format!(
                "GGUF version {version} is not supported (only 2 and 3)"
            )));
        }
        let tensor_count = r.u64()?;
        let kv_count = r.u64()?;
        let mut kv = HashMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty)?;
            kv.insert(key, value);
        }
        Ok(Self {
            version,
            tensor_count,
            kv,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&[Value]> {
        self.get(key).and_then(Value::as_array)
    }
}

struct Reader<'a, R: Read> {
    inner: &'a mut R,
}

impl<R: Read> Reader<'_, R> {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), TokenizerError> {
        self.inner
            .read_exact(buf)
            .map_err(|e| TokenizerError::Gguf(format!("truncated or unreadable metadata: {e}")))
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], TokenizerError> {
        let mut buf = [0u8; N];
        self.fill(&mut buf)?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, TokenizerError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, TokenizerError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn len(&mut self) -> Result<usize, TokenizerError> {
        let len = self.u64()?;
        if len > MAX_LEN {
            return Err(TokenizerError::Gguf(format!(
                "length {len} is implausibly large; the file is corrupt"
            )));
        }
        usize::try_from(len).map_err(|_| TokenizerError::Gguf(format!("length {len} overflows")))
    }

    fn string(&mut self) -> Result<String, TokenizerError> {
        let len = self.len()?;
        let mut buf = vec![0u8; len];
        self.fill(&mut buf)?;
        // llama.cpp stores raw bytes; a few vocabularies hold tokens that are not valid
        // UTF-8 on their own, so decode lossily rather than refusing the file.
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn value(&mut self, ty: u32) -> Result<Value, TokenizerError> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.bytes()?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 => {
                let item_ty = self.u32()?;
                let len = self.len()?;
                let mut items = Vec::with_capacity(len.min(1 << 20));
                for _ in 0..len {
                    items.push(self.value(item_ty)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => {
                return Err(TokenizerError::Gguf(format!(
                    "unknown metadata value type {other}"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push_str(buf: &mut Vec<u8>, s: &str) {
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    }

    fn sample() -> Vec<u8> {
        let mut buf = b"GGUF".to_vec();
        buf.extend_from_slice(&3u32.to_le_bytes());
        buf.extend_from_slice(&0u64.to_le_bytes());
        buf.extend_from_slice(&3u64.to_le_bytes());
        push_str(&mut buf, "general.architecture");
        buf.extend_from_slice(&8u32.to_le_bytes());
        push_str(&mut buf, "llama");
        push_str(&mut buf, "tokenizer.ggml.bos_token_id");
        buf.extend_from_slice(&4u32.to_le_bytes());
        buf.extend_from_slice(&7u32.to_le_bytes());
        push_str(&mut buf, "tokenizer.ggml.tokens");
        buf.extend_from_slice(&9u32.to_le_bytes());
        buf.extend_from_slice(&8u32.to_le_bytes());
        buf.extend_from_slice(&2u64.to_le_bytes());
        push_str(&mut buf, "a");
        push_str(&mut buf, "b");
        buf
    }

    #[test]
    fn reads_scalars_strings_and_arrays() {
        let meta = GgufMetadata::read(&mut sample().as_slice()).unwrap();
        assert_eq!(meta.version, 3);
        assert_eq!(meta.get_str("general.architecture"), Some("llama"));
        assert_eq!(meta.get_u64("tokenizer.ggml.bos_token_id"), Some(7));
        let tokens: Vec<_> = meta
            .get_array("tokenizer.ggml.tokens")
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(tokens, ["a", "b"]);
    }

    #[test]
    fn truncated_file_is_an_error_not_a_panic() {
        let full = sample();
        for cut in 0..full.len() {
            let err = GgufMetadata::read(&mut &full[..cut]).unwrap_err();
            assert!(
                matches!(err, TokenizerError::Gguf(_)),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn wrong_magic_and_version_are_named() {
        let err = GgufMetadata::read(&mut &b"GGML\x03\0\0\0"[..]).unwrap_err();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");
        let err = GgufMetadata::read(&mut &b"GGUF\x01\0\0\0"[..]).unwrap_err();
        assert!(err.to_string().contains("version 1"), "{err}");
    }
}
