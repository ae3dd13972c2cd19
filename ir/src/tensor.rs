//! Tensors: a type and row-major data, the values programs consume and produce.

use crate::literal::{Data, Literal, Scalar};
use crate::types::{DType, TensorType};
use std::fmt;

/// A dense tensor: its type and its elements in row-major (C) order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    ty: TensorType,
    data: Data,
}

/// Data that does not fit the type it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorError(pub String);

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TensorError {}

impl Tensor {
    /// A tensor of type `ty` holding `data`; the dtype and element count must match.
    pub fn new(ty: TensorType, data: Data) -> Result<Tensor, TensorError> {
        if data.dtype() != ty.dtype() {
            return Err(TensorError(format!(
                "{} data for a tensor of type {ty}",
                data.dtype()
            )));
        }
        if data.len() as u64 != ty.numel() {
            return Err(TensorError(format!(
                "{} elements for a tensor of type {ty}, which has {}",
                data.len(),
                ty.numel()
            )));
        }
        Ok(Tensor { ty, data })
    }

    /// A tensor with the given dims and data (the dtype is the data's).
    pub fn from_data(dims: &[u64], data: Data) -> Result<Tensor, TensorError> {
        let ty =
            TensorType::new(data.dtype(), dims.to_vec()).map_err(|e| TensorError(e.to_string()))?;
        Tensor::new(ty, data)
    }

    /// An `f32` tensor from a `Vec` (moved) or a slice (copied).
    pub fn from_f32(dims: &[u64], data: impl Into<Vec<f32>>) -> Result<Tensor, TensorError> {
        Tensor::from_data(dims, Data::F32(data.into()))
    }

    /// Every element equal to `s`.
    pub fn splat(ty: TensorType, s: Scalar) -> Result<Tensor, TensorError> {
        if s.dtype() != ty.dtype() {
            return Err(TensorError(format!(
                "a {} scalar for a tensor of type {ty}",
                s.dtype()
            )));
        }
        let n = usize::try_from(ty.numel())
            .map_err(|_| TensorError(format!("{ty} is too large to allocate")))?;
        let data = match s {
            Scalar::F32(x) => Data::F32(vec![x; n]),
            Scalar::F64(x) => Data::F64(vec![x; n]),
            Scalar::I8(x) => Data::I8(vec![x; n]),
            Scalar::U8(x) => Data::U8(vec![x; n]),
            Scalar::I32(x) => Data::I32(vec![x; n]),
            Scalar::I64(x) => Data::I64(vec![x; n]),
            Scalar::Bool(x) => Data::Bool(vec![x; n]),
        };
        Ok(Tensor { ty, data })
    }

    /// Zeros (or `false`) of the given type.
    pub fn zeros(ty: TensorType) -> Result<Tensor, TensorError> {
        let s = match ty.dtype() {
            DType::F32 => Scalar::F32(0.0),
            DType::F64 => Scalar::F64(0.0),
            DType::I8 => Scalar::I8(0),
            DType::U8 => Scalar::U8(0),
            DType::I32 => Scalar::I32(0),
            DType::I64 => Scalar::I64(0),
            DType::Bool => Scalar::Bool(false),
        };
        Tensor::splat(ty, s)
    }

    /// The value of a constant op.
    pub fn from_literal(ty: &TensorType, value: &Literal) -> Result<Tensor, TensorError> {
        match value {
            Literal::Splat(s) => Tensor::splat(ty.clone(), *s),
            Literal::Dense(d) => Tensor::new(ty.clone(), Data::clone(d)),
        }
    }

    /// The type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype()
    }

    /// The extents.
    pub fn dims(&self) -> &[u64] {
        self.ty.dims()
    }

    /// The elements.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Takes the elements.
    pub fn into_data(self) -> Data {
        self.data
    }

    /// The elements as `f32`, if that is the dtype.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as little-endian bytes, a `bool` as one byte (0 or 1): how they lie in
    /// memory, and in an ONNX tensor's raw data.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I8(v) => v.iter().map(|&x| x as u8).collect(),
            Data::U8(v) => v.clone(),
            Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        }
    }

    /// A tensor of type `ty` from its elements' little-endian bytes (a `bool` is any byte, true
    /// unless 0); an error unless there are exactly `ty.size_bytes()` of them.
    pub fn from_le_bytes(ty: &TensorType, b: &[u8]) -> Result<Tensor, TensorError> {
        check_size(ty, b)?;
        fn words<const N: usize, T>(b: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
            (b.chunks_exact(N))
                .map(|c| from(c.try_into().expect("chunks of N bytes")))
                .collect()
        }
        let data = match ty.dtype() {
            DType::F32 => Data::F32(words(b, f32::from_le_bytes)),
            DType::F64 => Data::F64(words(b, f64::from_le_bytes)),
            DType::I8 => Data::I8(b.iter().map(|&x| x as i8).collect()),
            DType::U8 => Data::U8(b.to_vec()),
            DType::I32 => Data::I32(words(b, i32::from_le_bytes)),
            DType::I64 => Data::I64(words(b, i64::from_le_bytes)),
            DType::Bool => Data::Bool(b.iter().map(|&x| x != 0).collect()),
        };
        Tensor::new(ty.clone(), data)
    }
}

/// A tensor borrowed from memory someone else owns (a numpy array, a memory-mapped file): its
/// type and its elements' bytes in row-major order, as [`Tensor::to_le_bytes`] lays them out.
/// Compiled programs read their inputs in place through one (`Executable::run_refs`), so an
/// input is not copied.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    ty: &'a TensorType,
    bytes: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// The bytes `bytes` as a tensor of type `ty`: exactly `ty.size_bytes()` of them, aligned
    /// to the element size (kernels load elements in place), and for `bool` each 0 or 1.
    pub fn new(ty: &'a TensorType, bytes: &'a [u8]) -> Result<TensorRef<'a>, TensorError> {
        check_size(ty, bytes)?;
        let align = ty.dtype().size_bytes() as usize;
        if !bytes.is_empty() && !(bytes.as_ptr() as usize).is_multiple_of(align) {
            return Err(TensorError(format!(
                "the data of a {ty} tensor at {:p} is not aligned to its {align}-byte elements",
                bytes.as_ptr()
            )));
        }
        if ty.dtype() == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(TensorError(format!(
                "a {ty} tensor holds a byte other than 0 or 1"
            )));
        }
        Ok(TensorRef { ty, bytes })
    }

    /// The type.
    pub fn ty(&self) -> &'a TensorType {
        self.ty
    }

    /// The elements' bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// A copy that owns its elements.
    pub fn to_tensor(&self) -> Tensor {
        Tensor::from_le_bytes(self.ty, self.bytes).expect("sized for its type when made")
    }
}

impl Tensor {
    /// The tensor borrowed, for APIs that take [`TensorRef`]s.
    pub fn view(&self) -> TensorRef<'_> {
        let bytes: &[u8] = match &self.data {
            Data::F32(v) => bytes_of(v),
            Data::F64(v) => bytes_of(v),
            Data::I8(v) => bytes_of(v),
            Data::U8(v) => v,
            Data::I32(v) => bytes_of(v),
            Data::I64(v) => bytes_of(v),
            Data::Bool(v) => bytes_of(v),
        };
        TensorRef {
            ty: &self.ty,
            bytes,
        }
    }
}

/// That `bytes` are exactly the `ty.size_bytes()` of a tensor of type `ty`.
fn check_size(ty: &TensorType, bytes: &[u8]) -> Result<(), TensorError> {
    if bytes.len() as u64 != ty.size_bytes() {
        return Err(TensorError(format!(
            "{} bytes for a tensor of type {ty}, which takes {}",
            bytes.len(),
            ty.size_bytes()
        )));
    }
    Ok(())
}

/// A slice of plain numbers (or `bool`s, one byte each, 0 or 1) as its bytes.
fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is a number type or `bool` without padding; any initialised value's bytes
    // are initialised `u8`s, and the length covers exactly the slice's memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_bytes_round_trip() {
        let cases = [
            Data::F32(vec![1.5, -0.0, f32::NAN]),
            Data::F64(vec![1e300, -2.0]),
            Data::I8(vec![-128, 7]),
            Data::U8(vec![255, 0]),
            Data::I32(vec![i32::MIN, 1]),
            Data::I64(vec![i64::MAX]),
            Data::Bool(vec![true, false, true]),
        ];
        for data in cases {
            let n = data.len() as u64;
            let t = Tensor::from_data(&[n], data).unwrap();
            let b = t.to_le_bytes();
            assert_eq!(b.len() as u64, t.ty().size_bytes());
            let back = Tensor::from_le_bytes(t.ty(), &b).unwrap();
            assert_eq!(back.to_le_bytes(), b, "{:?}", t.dtype());
        }
        let t = Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap();
        assert_eq!(t.to_le_bytes()[4..], 2.0f32.to_le_bytes());
        let e = Tensor::from_le_bytes(t.ty(), &[0; 7]).unwrap_err();
        assert!(e.0.contains("7 bytes"), "{e}");
    }
}
