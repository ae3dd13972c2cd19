//! `TensorProto` to [`Tensor`]: element types, the typed and raw data fields, external data.

use crate::proto::TensorProto;
use crate::proto::tensor_proto::{DataLocation, DataType};
use crate::{Error, Result};
use std::path::Path;
use tcc_ir::{DType, Data, Tensor, TensorType};

/// The tcc dtype of an ONNX element type, or an "unsupported" error naming it.
pub(crate) fn dtype(elem_type: i32, what: &str) -> Result<DType> {
    let t = DataType::try_from(elem_type).unwrap_or(DataType::Undefined);
    Ok(match t {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Int8 => DType::I8,
        DataType::Uint8 => DType::U8,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        DataType::Undefined => {
            return Err(Error::invalid(format!(
                "{what} has an undefined element type ({elem_type})"
            )));
        }
        other => {
            return Err(Error::unsupported(format!(
                "{what} has element type {}, which tcc does not support (it has f32, f64, i8, u8, i32, i64 and bool)",
                other.as_str_name()
            )));
        }
    })
}

/// Tensor dims from signed ONNX dims, rejecting negative and oversized shapes.
pub(crate) fn tensor_type(dtype: DType, dims: &[i64], what: &str) -> Result<TensorType> {
    let dims: Vec<u64> = dims
        .iter()
        .map(|&d| {
            u64::try_from(d)
                .map_err(|_| Error::invalid(format!("{what} has a negative dimension {d}")))
        })
        .collect::<Result<_>>()?;
    TensorType::new(dtype, dims).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

/// Decodes a tensor. `dir` is where external data files are looked up (the model's folder).
pub(crate) fn from_proto(t: &TensorProto, dir: Option<&Path>, what: &str) -> Result<Tensor> {
    let what = match t.name.as_deref() {
        Some(n) if !n.is_empty() => format!("{what} `{n}`"),
        _ => what.to_string(),
    };
    if t.segment.is_some() {
        return Err(Error::unsupported(format!(
            "{what} is segmented, which tcc does not support"
        )));
    }
    let dt = dtype(t.data_type.unwrap_or(0), &what)?;
    let ty = tensor_type(dt, &t.dims, &what)?;
    let n = ty.numel() as usize;
    let external = t.data_location == Some(DataLocation::External as i32);
    // Inline raw data is read where it is (a model's weights are most of its bytes).
    let raw: Option<std::borrow::Cow<[u8]>> = if external {
        Some(read_external(t, dir, &what, n as u64 * dt.size_bytes())?.into())
    } else {
        t.raw_data.as_deref().map(Into::into)
    };
    let count = |len: usize, field: &str| -> Result<()> {
        if len == n {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{what}: {field} holds {len} elements, but its shape {:?} has {n}",
                ty.dims()
            )))
        }
    };
    let data = if let Some(raw) = raw {
        let size = dt.size_bytes() as usize;
        if raw.len() != n * size {
            return Err(Error::invalid(format!(
                "{what}: raw data has {} bytes, but {} of {} take {}",
                raw.len(),
                n,
                dt,
                n * size
            )));
        }
        let chunks = raw.chunks_exact(size);
        match dt {
            DType::F32 => Data::F32(
                chunks
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F64 => Data::F64(
                chunks
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I32 => Data::I32(
                chunks
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I64 => Data::I64(
                chunks
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I8 => Data::I8(raw.iter().map(|&b| b as i8).collect()),
            DType::U8 => Data::U8(raw.into_owned()),
            DType::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
        }
    } else {
        match dt {
            DType::F32 => {
                count(t.float_data.len(), "float_data")?;
                Data::F32(t.float_data.clone())
            }
            DType::F64 => {
                count(t.double_data.len(), "double_data")?;
                Data::F64(t.double_data.clone())
            }
            DType::I64 => {
                count(t.int64_data.len(), "int64_data")?;
                Data::I64(t.int64_data.clone())
            }
            DType::I32 | DType::I8 | DType::U8 | DType::Bool => {
                count(t.int32_data.len(), "int32_data")?;
                let v = &t.int32_data;
                match dt {
                    DType::I32 => Data::I32(v.clone()),
                    DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
                    DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
                    _ => Data::Bool(v.iter().map(|&x| x != 0).collect()),
                }
            }
        }
    };
    Tensor::new(ty, data).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

/// Reads the bytes of an externally stored tensor: `location` relative to `dir`, with optional
/// `offset` and `length`.
fn read_external(t: &TensorProto, dir: Option<&Path>, what: &str, want: u64) -> Result<Vec<u8>> {
    let mut location = None;
    let (mut offset, mut length) = (0u64, None);
    for kv in &t.external_data {
        let (k, v) = (
            kv.key.as_deref().unwrap_or(""),
            kv.value.as_deref().unwrap_or(""),
        );
        let num = || {
            v.parse::<u64>().map_err(|_| {
                Error::invalid(format!(
                    "{what}: external data `{k}` is `{v}`, not a byte count"
                ))
            })
        };
        match k {
            "location" => location = Some(v),
            "offset" => offset = num()?,
            "length" => length = Some(num()?),
            _ => {}
        }
    }
    let location = location.ok_or_else(|| {
        Error::invalid(format!(
            "{what}: stored externally, but no `location` is given"
        ))
    })?;
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::invalid(format!(
            "{what}: external data location `{location}` must be a relative path inside the model's folder"
        )));
    }
    let dir = dir.ok_or_else(|| {
        Error::invalid(format!(
            "{what}: stored in external file `{location}`, but the model was not read from a file (import it from its path)"
        ))
    })?;
    let path = dir.join(rel);
    let length = length.unwrap_or(want);
    if length != want {
        return Err(Error::invalid(format!(
            "{what}: external data length {length} does not match the {want} bytes its shape needs"
        )));
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(&path)
        .map_err(|e| Error::invalid(format!("{what}: cannot open `{}`: {e}", path.display())))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(Error::invalid(format!(
            "{what}: `{}` has {size} bytes; the tensor wants {length} at offset {offset}",
            path.display()
        )));
    }
    let mut buf = vec![0; length as usize];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut buf))
        .map_err(|e| Error::invalid(format!("{what}: reading `{}`: {e}", path.display())))?;
    Ok(buf)
}

/// The ONNX element type of `dt`.
pub(crate) fn elem_type(dt: DType) -> DataType {
    match dt {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
    }
}

/// Encodes a tensor as a `TensorProto` named `name`, its elements little-endian in `raw_data`.
pub(crate) fn to_proto(name: &str, t: &Tensor) -> TensorProto {
    let data_type = elem_type(t.dtype());
    let raw = t.to_le_bytes();
    TensorProto {
        name: Some(name.to_string()),
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: Some(data_type as i32),
        raw_data: Some(raw),
        ..Default::default()
    }
}
