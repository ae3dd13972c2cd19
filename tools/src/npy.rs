//! Reading and writing numpy's `.npy` format (versions 1.0, 2.0 and 3.0) for every IR dtype.
//!
//! Only C-order arrays are accepted; big-endian data is byte-swapped on read. Anything else
//! (Fortran order, an unsupported dtype such as float16, a truncated file) is an error that says
//! what was found.

use tcc_ir::{DType, Data, Tensor, TensorType};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The `descr` numpy writes for each dtype (little-endian where it matters).
fn descr(d: DType) -> &'static str {
    match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
    }
}

/// Encodes a tensor as a version 1.0 `.npy` file.
pub fn write(t: &Tensor) -> Vec<u8> {
    let shape = match t.dims() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        ds => format!(
            "({})",
            ds.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // Pad so that the data starts on a 64-byte boundary; the header ends with a newline.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + t.ty().size_bytes() as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    match t.data() {
        Data::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::I8(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::U8(v) => out.extend_from_slice(v),
        Data::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::Bool(v) => v.iter().for_each(|&x| out.push(x as u8)),
    }
    out
}

/// The value of `'key': ...` in a `.npy` header dict, up to the next top-level comma or brace.
fn field<'h>(header: &'h str, key: &str) -> Result<&'h str, String> {
    let pat = format!("'{key}':");
    let start = header
        .find(&pat)
        .ok_or_else(|| format!("the header has no '{key}' entry"))?
        + pat.len();
    let rest = header[start..].trim_start();
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Ok(rest[..i].trim()),
            _ => {}
        }
    }
    Err(format!("the header's '{key}' entry is not terminated"))
}

/// Decodes a `.npy` file.
pub fn read(bytes: &[u8]) -> Result<Tensor, String> {
    if !bytes.starts_with(MAGIC) || bytes.len() < 10 {
        return Err("not a .npy file (it does not start with \\x93NUMPY)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(format!("unsupported .npy version {major}.{minor}")),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or("the .npy header is truncated")?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| "the .npy header is not text")?;
    let descr_text = field(header, "descr")?.trim_matches(|c| c == '\'' || c == '"');
    match field(header, "fortran_order")? {
        "False" => {}
        "True" => {
            return Err(
                "the array is in Fortran order; save it in C order (numpy.ascontiguousarray)"
                    .into(),
            );
        }
        other => return Err(format!("bad 'fortran_order' value `{other}`")),
    }
    let shape_text = field(header, "shape")?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("bad 'shape' value `{shape_text}`"))?;
    let dims: Vec<u64> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| format!("bad dimension `{s}` in 'shape'"))
        })
        .collect::<Result<_, _>>()?;
    let (order, code) = descr_text.split_at(descr_text.len().min(1));
    let dtype = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "b1" => DType::Bool,
        _ => {
            return Err(format!(
                "unsupported dtype '{descr_text}'; tcc reads f4, f8, i1, u1, i4, i8 and b1 (float32, float64, int8, uint8, int32, int64, bool)"
            ));
        }
    };
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(format!("bad byte order in dtype '{descr_text}'")),
    };
    let ty = TensorType::new(dtype, dims).map_err(|e| e.to_string())?;
    let body = &bytes[end..];
    if body.len() as u64 != ty.size_bytes() {
        return Err(format!(
            "{ty} needs {} bytes of data, the file has {}",
            ty.size_bytes(),
            body.len()
        ));
    }
    macro_rules! words {
        ($t:ty, $n:expr) => {
            body.chunks_exact($n)
                .map(|c| {
                    let a: [u8; $n] = c.try_into().expect("exact chunks");
                    if big {
                        <$t>::from_be_bytes(a)
                    } else {
                        <$t>::from_le_bytes(a)
                    }
                })
                .collect()
        };
    }
    let data = match dtype {
        DType::F32 => Data::F32(words!(f32, 4)),
        DType::F64 => Data::F64(words!(f64, 8)),
        DType::I8 => Data::I8(body.iter().map(|&b| b as i8).collect()),
        DType::U8 => Data::U8(body.to_vec()),
        DType::I32 => Data::I32(words!(i32, 4)),
        DType::I64 => Data::I64(words!(i64, 8)),
        DType::Bool => Data::Bool(body.iter().map(|&b| b != 0).collect()),
    };
    Tensor::new(ty, data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        let cases = [
            Data::F32(vec![1.5, -0.0, f32::NAN]),
            Data::F64(vec![1e300, -2.5, 0.1]),
            Data::I8(vec![-128, 0, 127]),
            Data::U8(vec![0, 1, 255]),
            Data::I32(vec![i32::MIN, 0, i32::MAX]),
            Data::I64(vec![i64::MIN, 0, i64::MAX]),
            Data::Bool(vec![true, false, true]),
        ];
        for d in cases {
            let t = Tensor::from_data(&[3], d).unwrap();
            let bytes = write(&t);
            assert_eq!(
                (bytes.len() - t.ty().size_bytes() as usize) % 64,
                0,
                "data is 64-byte aligned"
            );
            let back = read(&bytes).unwrap();
            assert_eq!(back.ty(), t.ty());
            assert_eq!(write(&back), bytes);
        }
        let scalar = Tensor::from_data(&[], Data::F64(vec![2.0])).unwrap();
        assert_eq!(read(&write(&scalar)).unwrap(), scalar);
    }

    #[test]
    fn truncated_and_foreign_input_is_an_error() {
        let t = Tensor::from_f32(&[2, 2], vec![1.0; 4]).unwrap();
        let bytes = write(&t);
        assert!(
            read(&bytes[..bytes.len() - 1])
                .unwrap_err()
                .contains("needs 16 bytes of data, the file has 15")
        );
        assert!(read(&bytes[..20]).unwrap_err().contains("truncated"));
        assert!(
            read(b"PK\x03\x04 not npy")
                .unwrap_err()
                .contains("not a .npy file")
        );
        assert!(read(b"").is_err());
    }
}
