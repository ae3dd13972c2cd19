//! Memory analysis: the bytes live at each op of a scheduled function, and the peak.
//!
//! Every op result is a buffer live from the op that defines it through the last op that reads
//! it (results of the function live to the end); `reshape` results share their operand's buffer
//! and extend its life. Parameters (the caller's inputs, weights, optimizer state) and
//! non-splat constants are counted apart from activations and temporaries. One pass over the
//! schedule: linear in ops plus operands.
//!
//! Host values (`swap_out`'s results) live in host memory: they are counted apart (`host`,
//! `host_peak`), not in the device's `live`, so a swap frees the device's bytes from the
//! `swap_out` to the `swap_in`.
//!
//! This is the op-level model passes reason with (`remat` simulates its peak). The CPU
//! backend's arena (`tcc_codegen::plan_memory`) differs in known ways: values used only inside a
//! fused kernel are never stored (smaller), elementwise kernels write in place over a dead input
//! (smaller), scratch for im2col is added (larger), and placement leaves gaps (larger); docs/passes.md
//! has the comparison.

use cranelift_entity::SecondaryMap;
use tcc_ir::{Function, OpKind, Value, ValueDef};

/// The result of [`analyze`].
#[derive(Clone, Debug)]
pub struct MemoryProfile {
    /// `live[i]`: bytes of activations and temporaries live while scheduled op `i` runs (its
    /// operands and its results included).
    pub live: Vec<u64>,
    /// The largest entry of `live` (0 for an empty schedule).
    pub peak: u64,
    /// The first op index where the peak is reached.
    pub peak_at: usize,
    /// `live` without the buffers the function returns (the activations and temporaries a
    /// rewrite such as `remat` can shrink).
    pub live_temps: Vec<u64>,
    /// The largest entry of `live_temps`, and where it is first reached.
    pub temps_peak: (u64, usize),
    /// Bytes of the buffers the function returns.
    pub result_bytes: u64,
    /// Bytes of parameters.
    pub param_bytes: u64,
    /// Bytes of non-splat constants.
    pub const_bytes: u64,
    /// `host[i]`: bytes of host values (`swap_out`'s results) live while op `i` runs.
    pub host: Vec<u64>,
    /// The largest entry of `host`, and where it is first reached.
    pub host_peak: (u64, usize),
    /// For each value that owns a buffer: its size, and the schedule range it is live over
    /// (inclusive).
    pub buffers: Vec<Buffer>,
}

/// One buffer of the analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The value that owns it.
    pub value: Value,
    /// Its size in bytes.
    pub bytes: u64,
    /// The index of its defining op in the schedule.
    pub first: usize,
    /// The index of its last reader (the schedule length for results of the function).
    pub last: usize,
    /// Whether it is in host memory (a `swap_out`'s result).
    pub host: bool,
}

/// Analyzes `f`, which must verify.
pub fn analyze(f: &Function) -> MemoryProfile {
    let sched = f.schedule();
    let n = sched.len();
    let nv = f.num_values_created();
    // The value whose buffer each value uses: itself, or a reshape's source (transitively).
    let mut owner: SecondaryMap<Value, Option<Value>> = SecondaryMap::with_capacity(nv);
    let mut first: SecondaryMap<Value, usize> = SecondaryMap::with_capacity(nv);
    let mut last: SecondaryMap<Value, Option<usize>> = SecondaryMap::with_capacity(nv);
    let mut param_bytes = 0;
    for &p in f.params() {
        param_bytes += f.ty(p).size_bytes();
    }
    let mut const_bytes = 0;
    for (i, &op) in sched.iter().enumerate() {
        let d = f.op(op);
        for &a in &d.args {
            if let Some(o) = owner[a] {
                last[o] = Some(last[o].map_or(i, |l| l.max(i)));
            }
        }
        match &d.kind {
            OpKind::Const { ty, value } => {
                if value.as_splat().is_none() {
                    const_bytes += ty.size_bytes();
                }
            }
            OpKind::Reshape { .. } => {
                owner[d.results[0]] = owner[d.args[0]];
            }
            _ => {
                for &r in &d.results {
                    owner[r] = Some(r);
                    first[r] = i;
                    last[r] = Some(i);
                }
            }
        }
    }
    for &r in f.results() {
        if let Some(o) = owner[r] {
            last[o] = Some(n);
        }
    }
    // Parameters own no activation buffer: `owner` stays `None` for them and for constants.
    let mut delta = vec![0i128; n + 2];
    let mut delta_temps = vec![0i128; n + 2];
    let mut delta_host = vec![0i128; n + 2];
    let mut result_bytes = 0;
    let mut buffers = Vec::new();
    for &op in sched {
        for &r in &f.op(op).results {
            if owner[r] != Some(r) || matches!(f.value(r).def, ValueDef::Param(_)) {
                continue;
            }
            let bytes = f.ty(r).size_bytes();
            let (a, b) = (first[r], last[r].unwrap_or(first[r]));
            let host = f.is_host(r);
            if host {
                delta_host[a] += bytes as i128;
                delta_host[b + 1] -= bytes as i128;
            } else {
                delta[a] += bytes as i128;
                delta[b + 1] -= bytes as i128;
            }
            if host {
                // Neither a result (the verifier rejects that) nor a device temporary.
            } else if b >= n {
                result_bytes += bytes;
            } else {
                delta_temps[a] += bytes as i128;
                delta_temps[b + 1] -= bytes as i128;
            }
            buffers.push(Buffer {
                value: r,
                bytes,
                first: a,
                last: b,
                host,
            });
        }
    }
    let prefix = |delta: &[i128]| -> Vec<u64> {
        let mut cur: i128 = 0;
        delta
            .iter()
            .take(n)
            .map(|d| {
                cur += d;
                cur as u64
            })
            .collect()
    };
    let argmax = |v: &[u64]| {
        v.iter().enumerate().fold(
            (0, 0),
            |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) },
        )
    };
    let (live, live_temps) = (prefix(&delta), prefix(&delta_temps));
    let host = prefix(&delta_host);
    let (peak_at, peak) = argmax(&live);
    let (temps_at, temps) = argmax(&live_temps);
    let (host_at, host_max) = argmax(&host);
    MemoryProfile {
        live,
        peak,
        peak_at,
        live_temps,
        temps_peak: (temps, temps_at),
        result_bytes,
        param_bytes,
        const_bytes,
        host,
        host_peak: (host_max, host_at),
        buffers,
    }
}

impl MemoryProfile {
    /// The device buffers live while op `at` runs, largest first.
    pub fn live_at(&self, at: usize) -> Vec<Buffer> {
        let mut v: Vec<Buffer> = self
            .buffers
            .iter()
            .copied()
            .filter(|b| !b.host && b.first <= at && at <= b.last)
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.first.cmp(&b.first)));
        v
    }
}

/// `bytes` in a short human form (`1.50 MiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// An SVG line chart of live bytes over the schedule, one polyline per series
/// (`(label, live bytes per op)`), scaled to the largest peak.
pub fn svg(title: &str, series: &[(&str, &[u64])]) -> String {
    let (w, h, left, bottom, top) = (800.0, 360.0, 80.0, 40.0, 30.0);
    let (pw, ph) = (w - left - 20.0, h - bottom - top);
    let ymax = series
        .iter()
        .flat_map(|(_, s)| s.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"14\">{}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">op in schedule order</text>\n",
        esc(title),
        top + ph,
        left + pw,
        top + ph,
        top + ph,
        left - 6.0,
        top + 4.0,
        human(ymax as u64),
        left - 6.0,
        top + ph,
        left + pw / 2.0,
        h - 8.0,
    );
    for (k, (label, s)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        let nx = (s.len().max(2) - 1) as f64;
        let mut pts = String::new();
        // Steps: each op's level held until the next op.
        for (i, &v) in s.iter().enumerate() {
            let x0 = left + pw * i as f64 / nx.max(1.0);
            let y = top + ph - ph * v as f64 / ymax;
            pts.push_str(&format!("{x0:.1},{y:.1} "));
        }
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            pts.trim_end()
        ));
        let peak = s.iter().copied().max().unwrap_or(0);
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{} (peak {})</text>\n",
            left + 10.0,
            top + 16.0 + 16.0 * k as f64,
            esc(label),
            human(peak)
        ));
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_bytes_by_hand() {
        let src = "func @f(%x: f32[1024], %w: f32[1024]) -> (f32[2048], f32[]) {
  %a = mul %x, %w : f32[1024]
  %b = exp %a : f32[1024]
  %c = concat %a, %b {axis=0} : f32[2048]
  %r = reshape %c {shape=[2048]} : f32[2048]
  %s = reduce_sum %c {axes=[0]} : f32[]
  %k = const {value=[1.0, 2.0]} : f32[2]
  return %r, %s
}";
        let f = tcc_ir::parse_function(src).unwrap();
        let p = analyze(&f);
        // a: 0..=2, b: 1..=2, c (and its reshape): 2..end, s: 4..end; the constant is apart.
        assert_eq!(p.live, [4096, 8192, 16384, 8192, 8196, 8196]);
        assert_eq!((p.peak, p.peak_at), (16384, 2));
        assert_eq!((p.param_bytes, p.const_bytes), (8192, 8));
        let at: Vec<&str> = p.live_at(2).iter().map(|b| f.name(b.value)).collect();
        assert_eq!(at, ["c", "a", "b"]);
        assert!(svg("t", &[("f", &p.live)]).starts_with("<svg"));
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(3 << 20), "3.00 MiB");
    }
}
