//! Element types, shapes and tensor types.
//!
//! Every value in tcc has a [`TensorType`]: a [`DType`] and a static [`Shape`]. A tensor type is
//! only constructed through [`TensorType::new`], which guarantees that its element count and byte
//! size fit in an `i64` (so later arithmetic on sizes cannot overflow).

use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, one byte per element.
    Bool,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The text spelling (`f32`, `i64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a text spelling.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// `f32` or `f64`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// Any integer type (not bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32 | DType::I64)
    }

    /// Float or integer: the types arithmetic is defined on.
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape: the extent of each axis, outermost first. Rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<u64>);

impl Shape {
    /// A scalar shape (rank 0).
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The extents.
    pub fn dims(&self) -> &[u64] {
        &self.0
    }

    /// Number of elements, or `None` if it overflows `u64`.
    pub fn checked_numel(&self) -> Option<u64> {
        self.0.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Number of elements. Only valid for shapes inside a [`TensorType`], whose element count is
    /// known to fit.
    pub fn numel(&self) -> u64 {
        self.0.iter().product()
    }
}

impl From<Vec<u64>> for Shape {
    fn from(v: Vec<u64>) -> Shape {
        Shape(v)
    }
}

impl From<&[u64]> for Shape {
    fn from(v: &[u64]) -> Shape {
        Shape(v.to_vec())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The largest element count or byte size a tensor may have (`i64::MAX`).
pub const MAX_TENSOR_BYTES: u64 = i64::MAX as u64;

/// The type of a value: element type and static shape, written `f32[2,3]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    dtype: DType,
    shape: Shape,
}

/// Why a tensor type could not be formed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeSizeError {
    /// The offending shape.
    pub shape: Shape,
    /// The element type.
    pub dtype: DType,
}

impl fmt::Display for TypeSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor type {}{} is too large: its size in bytes does not fit in 63 bits",
            self.dtype, self.shape
        )
    }
}

impl TensorType {
    /// Forms a tensor type, checking that its byte size fits in `i64`.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Result<TensorType, TypeSizeError> {
        let shape = shape.into();
        let fits = shape
            .checked_numel()
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .is_some_and(|b| b <= MAX_TENSOR_BYTES);
        if fits {
            Ok(TensorType { dtype, shape })
        } else {
            Err(TypeSizeError { shape, dtype })
        }
    }

    /// A scalar of the given dtype.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: Shape::scalar(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The extents of the shape.
    pub fn dims(&self) -> &[u64] {
        &self.shape.0
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.numel()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.numel() * self.dtype.size_bytes()
    }

    /// The same shape with another element type (always fits: sizes are at most 8 bytes, and the
    /// check is repeated).
    pub fn with_dtype(&self, dtype: DType) -> Result<TensorType, TypeSizeError> {
        TensorType::new(dtype, self.shape.clone())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        let t = TensorType::new(DType::F32, vec![2, 3]).unwrap();
        assert_eq!(t.size_bytes(), 24);
        assert_eq!(t.to_string(), "f32[2,3]");
        let big = vec![4294967296, 4294967296, 4294967296];
        assert!(TensorType::new(DType::F32, big).is_err());
        // 2^62 bytes of f32 fits in 63 bits? 2^60 elements * 4 = 2^62: yes.
        assert!(TensorType::new(DType::F32, vec![1 << 60]).is_ok());
        assert!(TensorType::new(DType::F32, vec![1 << 61]).is_err());
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("f16"), None);
    }
}
