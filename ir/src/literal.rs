//! Constant payloads: a splat scalar or dense row-major data of one dtype.
//!
//! Floats compare and hash by bit pattern, so constants can be keys in CSE tables and `nan`
//! constants are equal to themselves. Text uses Rust's shortest round-trip float formatting, so
//! printing and re-parsing a literal is exact (NaN payloads aside).

use crate::types::DType;
use std::fmt;
use std::hash::{Hash, Hasher};

/// One element of some dtype.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// An `f32`.
    F32(f32),
    /// An `f64`.
    F64(f64),
    /// An `i8`.
    I8(i8),
    /// A `u8`.
    U8(u8),
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// A `bool`.
    Bool(bool),
}

impl Scalar {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::F64(_) => DType::F64,
            Scalar::I8(_) => DType::I8,
            Scalar::U8(_) => DType::U8,
            Scalar::I32(_) => DType::I32,
            Scalar::I64(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
        }
    }

    /// `x` as a scalar of `dtype`, by Rust's `as` conversions (integers saturate and take NaN to
    /// 0; bool is `x != 0`).
    pub fn from_f64(dtype: DType, x: f64) -> Scalar {
        match dtype {
            DType::F32 => Scalar::F32(x as f32),
            DType::F64 => Scalar::F64(x),
            DType::I8 => Scalar::I8(x as i8),
            DType::U8 => Scalar::U8(x as u8),
            DType::I32 => Scalar::I32(x as i32),
            DType::I64 => Scalar::I64(x as i64),
            DType::Bool => Scalar::Bool(x != 0.0),
        }
    }

    /// The value as `f64` (exact for every dtype but large `i64`).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::F32(x) => x as f64,
            Scalar::F64(x) => x,
            Scalar::I8(x) => x as f64,
            Scalar::U8(x) => x as f64,
            Scalar::I32(x) => x as f64,
            Scalar::I64(x) => x as f64,
            Scalar::Bool(x) => x as u8 as f64,
        }
    }

    /// Bits that identify the value exactly (floats by bit pattern).
    fn key(self) -> (u8, u64) {
        match self {
            Scalar::F32(x) => (0, x.to_bits() as u64),
            Scalar::F64(x) => (1, x.to_bits()),
            Scalar::I8(x) => (2, x as u8 as u64),
            Scalar::U8(x) => (3, x as u64),
            Scalar::I32(x) => (4, x as u32 as u64),
            Scalar::I64(x) => (5, x as u64),
            Scalar::Bool(x) => (6, x as u64),
        }
    }

    /// Whether this is exactly the number `v` (for identities like `x*1`); `-0.0 == 0.0` here.
    pub fn is(self, v: f64) -> bool {
        match self {
            Scalar::Bool(_) => false,
            s => s.to_f64() == v,
        }
    }

    /// Parses one element of `dtype` from its text (`1.5`, `-3`, `nan`, `-inf`, `true`).
    pub fn parse(dtype: DType, text: &str) -> Result<Scalar, String> {
        let bad = || format!("`{text}` is not a valid {dtype} literal");
        fn float<T: std::str::FromStr>(text: &str) -> Option<T> {
            let t = match text {
                "nan" => "NaN",
                "inf" => "inf",
                "-inf" => "-inf",
                t => t,
            };
            if !t.bytes().any(|b| b.is_ascii_digit()) && !matches!(t, "NaN" | "inf" | "-inf") {
                return None;
            }
            t.parse().ok()
        }
        Ok(match dtype {
            DType::F32 => Scalar::F32(float(text).ok_or_else(bad)?),
            DType::F64 => Scalar::F64(float(text).ok_or_else(bad)?),
            DType::I8 => Scalar::I8(text.parse().map_err(|_| bad())?),
            DType::U8 => Scalar::U8(text.parse().map_err(|_| bad())?),
            DType::I32 => Scalar::I32(text.parse().map_err(|_| bad())?),
            DType::I64 => Scalar::I64(text.parse().map_err(|_| bad())?),
            DType::Bool => match text {
                "true" => Scalar::Bool(true),
                "false" => Scalar::Bool(false),
                _ => return Err(bad()),
            },
        })
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Scalar {}
impl Hash for Scalar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

/// Writes a float so that parsing it back gives the same bits (NaN payloads aside).
pub fn fmt_float(f: &mut fmt::Formatter<'_>, x: f64, single: bool) -> fmt::Result {
    if x.is_nan() {
        f.write_str("nan")
    } else if x.is_infinite() {
        f.write_str(if x > 0.0 { "inf" } else { "-inf" })
    } else if single {
        write!(f, "{:?}", x as f32)
    } else {
        write!(f, "{x:?}")
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scalar::F32(x) => fmt_float(f, x as f64, true),
            Scalar::F64(x) => fmt_float(f, x, false),
            Scalar::I8(x) => write!(f, "{x}"),
            Scalar::U8(x) => write!(f, "{x}"),
            Scalar::I32(x) => write!(f, "{x}"),
            Scalar::I64(x) => write!(f, "{x}"),
            Scalar::Bool(x) => write!(f, "{x}"),
        }
    }
}

/// Dense row-major elements of one dtype.
#[derive(Clone, Debug)]
pub enum Data {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

/// Runs `$e` with `$v` bound to the vector inside a [`Data`](crate::Data), whatever its element
/// type: the one match over every dtype's vector, for code that treats them alike (lengths,
/// byte views).
#[macro_export]
macro_rules! each_data {
    ($d:expr, $v:ident => $e:expr) => {
        match $d {
            $crate::Data::F32($v) => $e,
            $crate::Data::F64($v) => $e,
            $crate::Data::I8($v) => $e,
            $crate::Data::U8($v) => $e,
            $crate::Data::I32($v) => $e,
            $crate::Data::I64($v) => $e,
            $crate::Data::Bool($v) => $e,
        }
    };
}

impl Data {
    /// Every element as f64 (booleans as 0 and 1), one pass per dtype.
    pub fn to_f64s(&self) -> Vec<f64> {
        match self {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

    /// An empty vector of `dtype` with room for `n` elements.
    pub fn with_capacity(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(Vec::with_capacity(n)),
            DType::F64 => Data::F64(Vec::with_capacity(n)),
            DType::I8 => Data::I8(Vec::with_capacity(n)),
            DType::U8 => Data::U8(Vec::with_capacity(n)),
            DType::I32 => Data::I32(Vec::with_capacity(n)),
            DType::I64 => Data::I64(Vec::with_capacity(n)),
            DType::Bool => Data::Bool(Vec::with_capacity(n)),
        }
    }

    /// Appends a scalar; `None` if its dtype differs from the vector's.
    pub fn push(&mut self, s: Scalar) -> Option<()> {
        match (self, s) {
            (Data::F32(v), Scalar::F32(x)) => v.push(x),
            (Data::F64(v), Scalar::F64(x)) => v.push(x),
            (Data::I8(v), Scalar::I8(x)) => v.push(x),
            (Data::U8(v), Scalar::U8(x)) => v.push(x),
            (Data::I32(v), Scalar::I32(x)) => v.push(x),
            (Data::I64(v), Scalar::I64(x)) => v.push(x),
            (Data::Bool(v), Scalar::Bool(x)) => v.push(x),
            _ => return None,
        }
        Some(())
    }

    /// Builds data from scalars that all have `dtype`.
    pub fn from_scalars(dtype: DType, xs: impl IntoIterator<Item = Scalar>) -> Option<Data> {
        let it = xs.into_iter();
        let mut d = Data::with_capacity(dtype, it.size_hint().0);
        for s in it {
            d.push(s)?;
        }
        Some(d)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a scalar.
    pub fn get(&self, i: usize) -> Scalar {
        match self {
            Data::F32(v) => Scalar::F32(v[i]),
            Data::F64(v) => Scalar::F64(v[i]),
            Data::I8(v) => Scalar::I8(v[i]),
            Data::U8(v) => Scalar::U8(v[i]),
            Data::I32(v) => Scalar::I32(v[i]),
            Data::I64(v) => Scalar::I64(v[i]),
            Data::Bool(v) => Scalar::Bool(v[i]),
        }
    }

    /// Iterates over the elements as scalars.
    pub fn iter(&self) -> impl Iterator<Item = Scalar> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        self.dtype() == other.dtype()
            && self.len() == other.len()
            && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}
impl Eq for Data {}
/// Elements a [`Data`] hash reads at most: all of them up to this count, then this many spread
/// evenly over the data. Equal data still hash equally; data that differ only elsewhere
/// collide and are told apart by `==`. A model's weights (tens of millions of elements) then
/// hash in microseconds, so passes that hash constants (`cse`) stay fast on them.
const HASHED_ELEMENTS: usize = 1024;

impl Hash for Data {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.dtype().hash(state);
        let n = self.len();
        n.hash(state);
        let step = n.div_ceil(HASHED_ELEMENTS).max(1);
        for i in (0..n).step_by(step) {
            self.get(i).hash(state);
        }
    }
}

/// The value of a constant: one scalar repeated over the shape, or every element.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Literal {
    /// Every element equals this scalar. Written `value=0.5`.
    Splat(Scalar),
    /// Row-major elements; the count equals the shape's element count. Written `value=[1, 2]`.
    /// Shared: cloning a function (a backend's rewrite of it, a pass's copy) does not copy its
    /// weights.
    Dense(std::sync::Arc<Data>),
}

impl Literal {
    /// A dense literal of `d`.
    pub fn dense(d: Data) -> Literal {
        Literal::Dense(std::sync::Arc::new(d))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Literal::Splat(s) => s.dtype(),
            Literal::Dense(d) => d.dtype(),
        }
    }

    /// The single value if every element is the same (a splat, or a one-element dense literal).
    pub fn as_splat(&self) -> Option<Scalar> {
        match self {
            Literal::Splat(s) => Some(*s),
            Literal::Dense(d) if d.len() == 1 => Some(d.get(0)),
            Literal::Dense(_) => None,
        }
    }

    /// Element `i` (for a splat, the scalar).
    pub fn get(&self, i: usize) -> Scalar {
        match self {
            Literal::Splat(s) => *s,
            Literal::Dense(d) => d.get(i),
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Splat(s) => write!(f, "{s}"),
            Literal::Dense(d) => {
                f.write_str("[")?;
                for (i, s) in d.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{s}")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_through_text() {
        for x in [0.1f32, -0.0, 1e-30, 3.4028235e38, f32::MIN_POSITIVE, 1.0] {
            let s = Scalar::F32(x).to_string();
            assert_eq!(
                Scalar::parse(DType::F32, &s).unwrap(),
                Scalar::F32(x),
                "{s}"
            );
        }
        for x in [0.1f64, 1e300, -2.5e-310, f64::INFINITY, f64::NEG_INFINITY] {
            let s = Scalar::F64(x).to_string();
            assert_eq!(
                Scalar::parse(DType::F64, &s).unwrap(),
                Scalar::F64(x),
                "{s}"
            );
        }
        let nan = Scalar::parse(DType::F32, "nan").unwrap();
        assert_eq!(nan.to_string(), "nan");
        assert_eq!(nan, nan);
    }

    #[test]
    fn ints_are_range_checked() {
        assert!(Scalar::parse(DType::I8, "127").is_ok());
        assert!(Scalar::parse(DType::I8, "128").is_err());
        assert!(Scalar::parse(DType::U8, "-1").is_err());
        assert!(Scalar::parse(DType::I32, "1.5").is_err());
        assert!(Scalar::parse(DType::F32, "infinity").is_err());
        assert!(Scalar::parse(DType::Bool, "1").is_err());
    }
}
