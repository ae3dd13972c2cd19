//! Indexing the interpreter's flat buffers: strides, multi-indices, broadcasting maps, the
//! blocked (NCHWc) layout's element map, and gathering elements by index.

use super::R;
use crate::interp::Buf;

pub(super) fn numel(dims: &[u64]) -> usize {
    dims.iter().product::<u64>() as usize
}

/// Row-major strides.
pub(super) fn strides(dims: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as usize;
    }
    s
}

/// Calls `f` with every multi-index of `dims`, in row-major order.
pub(super) fn for_each_index(dims: &[u64], mut f: impl FnMut(&[usize])) {
    if numel(dims) == 0 {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx);
        let mut ax = dims.len();
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < dims[ax] as usize {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// For each element of `to`, the flat index of the element of `from` that broadcasts to it.
pub(super) fn bcast_map(from: &[u64], to: &[u64]) -> Vec<usize> {
    let own = strides(from);
    let mut st = vec![0usize; to.len()];
    for (i, &d) in from.iter().enumerate() {
        let o = to.len() - from.len() + i;
        st[o] = if d == 1 { 0 } else { own[i] };
    }
    let mut out = Vec::with_capacity(numel(to));
    for_each_index(to, |ix| {
        out.push(ix.iter().zip(&st).map(|(i, s)| i * s).sum())
    });
    out
}

/// `(outer, n, inner)` sizes around `axis`.
pub(super) fn split(dims: &[u64], axis: usize) -> (usize, usize, usize) {
    (
        numel(&dims[..axis]),
        dims[axis] as usize,
        numel(&dims[axis + 1..]),
    )
}

/// Normalises an index into an axis of size `n`: `[-n, n)`, negative counting from the end.
pub(super) fn index(i: i64, n: usize) -> R<usize> {
    let j = if i < 0 { i + n as i64 } else { i };
    if (0..n as i64).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!("index {i} is out of range for an axis of size {n}"))
    }
}

/// Gathers elements of `buf` by flat index.
pub(super) fn take(buf: &Buf, idx: impl Iterator<Item = usize>) -> Buf {
    match buf {
        Buf::F(v) => Buf::F(idx.map(|i| v[i]).collect()),
        Buf::I(v) => Buf::I(idx.map(|i| v[i]).collect()),
        Buf::B(v) => Buf::B(idx.map(|i| v[i]).collect()),
    }
}

/// For each element of the channel-blocked form (`to_nchwc`) of a tensor of dims `plain`, in
/// row-major order, the flat index of the element of the plain tensor it holds; `None` in the
/// padding lanes of the last block.
pub(super) fn nchwc_map(plain: &[u64], block: u64) -> Vec<Option<usize>> {
    let blocked = crate::typing::nchwc_dims(plain, block);
    let ps = strides(plain);
    let (r, channels) = (blocked.len(), plain[1] as usize);
    let mut out = Vec::with_capacity(numel(&blocked));
    for_each_index(&blocked, |ix| {
        let c = ix[1] * block as usize + ix[r - 1];
        out.push(
            (c < channels).then(|| {
                ix[0] * ps[0] + c * ps[1] + (2..r - 1).map(|a| ix[a] * ps[a]).sum::<usize>()
            }),
        );
    });
    out
}

/// `to_nchwc` of `buf` (dims `plain`): zeros in the padding lanes.
pub(super) fn to_nchwc(buf: &Buf, plain: &[u64], block: u64) -> Buf {
    let map = nchwc_map(plain, block);
    match buf {
        Buf::F(v) => Buf::F(map.iter().map(|m| m.map_or(0.0, |i| v[i])).collect()),
        Buf::I(v) => Buf::I(map.iter().map(|m| m.map_or(0, |i| v[i])).collect()),
        Buf::B(v) => Buf::B(map.iter().map(|m| m.is_some_and(|i| v[i])).collect()),
    }
}

/// `from_nchwc` of `buf` into a tensor of dims `plain`.
pub(super) fn from_nchwc(buf: &Buf, plain: &[u64], block: u64) -> Buf {
    let map = nchwc_map(plain, block);
    fn scatter<T: Copy + Default>(v: &[T], map: &[Option<usize>], n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        for (k, m) in map.iter().enumerate() {
            if let Some(i) = m {
                out[*i] = v[k];
            }
        }
        out
    }
    let n = numel(plain);
    match buf {
        Buf::F(v) => Buf::F(scatter(v, &map, n)),
        Buf::I(v) => Buf::I(scatter(v, &map, n)),
        Buf::B(v) => Buf::B(scatter(v, &map, n)),
    }
}
