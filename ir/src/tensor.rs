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
}
