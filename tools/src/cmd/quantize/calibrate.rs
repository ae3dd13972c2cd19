//! Calibration for `tcc quantize`: the inputs it runs on, and the range each layer's input
//! takes over them as `--method` chooses it.

use super::Method;
use crate::io::Io;
use crate::{Error, npy};
use std::collections::HashMap;
use std::io::IsTerminal;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Function, Tensor, Value};
use tcc_passes::quant::ptq::{self, Range};

/// Bins of the histograms `--method percentile` cuts.
const BINS: usize = 4096;

/// Bins of the histograms of |x| `--method entropy` searches (TensorRT's 2048).
const ENTROPY_BINS: usize = 2048;

/// One run's inputs per calibration sample: the parameters with stored values take them, the
/// one left takes each `.npy` file of the directory (sorted by name) or random values.
pub(super) fn calibration_inputs(
    f: &Function,
    prepared: &[Tensor],
    m: &tcc_ir::Module,
    calib: &str,
) -> Result<Vec<Vec<Tensor>>, Error> {
    if let Some(n) = calib.strip_prefix("random:") {
        let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::usage(format!(
                "error: --calib `{calib}`: expected random:N with N >= 1"
            ))
        })?;
        return Ok((0..n)
            .map(|k| {
                (f.params().iter().enumerate())
                    .map(|(i, &p)| match m.weights.values.get(f.name(p)) {
                        Some(t) => Tensor::clone(t),
                        None => {
                            let seed = 0x9a7e_0000 + (k * 1000 + i) as u64;
                            random_tensor(f.ty(p), &mut Rng::new(seed))
                        }
                    })
                    .collect()
            })
            .collect());
    }
    let fed: Vec<usize> = (0..f.params().len())
        .filter(|&i| !m.weights.values.contains_key(f.name(f.params()[i])))
        .collect();
    // `tcc train --data`'s format: `<name>.npy` for every parameter to feed, each holding one
    // or more mini-batches of it; a run per mini-batch.
    let data = |i: usize| {
        let name = f.name(f.params()[i]);
        std::path::Path::new(calib).join(format!("{}.npy", crate::train::file_stem(name)))
    };
    if !fed.is_empty() && fed.iter().all(|&i| data(i).is_file()) {
        let feeds = (fed.iter())
            .map(|&i| {
                let p = f.params()[i];
                crate::train::Feed::new(f.name(p), &data(i), f.ty(p))
                    .map(|feed| (i, feed))
                    .map_err(Error::input)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batches = feeds[0].1.batches;
        if let Some((i, feed)) = feeds.iter().find(|(_, feed)| feed.batches != batches) {
            return Err(Error::input(format!(
                "error: --calib {calib}: `{}` holds {} mini-batches but `{}` holds {batches}; give every array the same number of rows",
                f.name(f.params()[*i]),
                feed.batches,
                f.name(f.params()[feeds[0].0])
            )));
        }
        return Ok((0..batches)
            .map(|b| {
                let mut run = prepared.to_vec();
                for (i, feed) in &feeds {
                    run[*i] = feed.get(b);
                }
                run
            })
            .collect());
    }
    let [fed] = fed[..] else {
        return Err(Error::usage(format!(
            "error: --calib {calib}: `@{}` has {} parameters to feed: give a directory with `<name>.npy` for each (as `tcc train --data` reads), or one of .npy files for a function with one",
            f.name,
            fed.len()
        )));
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(calib)
        .map_err(|e| Error::input(format!("error: --calib `{calib}`: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::input(format!(
            "error: --calib `{calib}`: no .npy files in it"
        )));
    }
    let p = f.params()[fed];
    files
        .iter()
        .map(|path| {
            let shown = path.display();
            let bytes = std::fs::read(path)
                .map_err(|e| Error::input(format!("error: cannot read `{shown}`: {e}")))?;
            let t =
                npy::read(&bytes).map_err(|e| Error::input(format!("error: `{shown}`: {e}")))?;
            if t.ty() != f.ty(p) {
                return Err(Error::input(format!(
                    "error: calibration input `{shown}` holds {}, but the parameter `{}` is {}",
                    t.ty(),
                    f.name(p),
                    f.ty(p)
                )));
            }
            let mut run = prepared.to_vec();
            run[fed] = t;
            Ok(run)
        })
        .collect()
}

/// `f` compiled with `extra` values as more results, after its own.
pub(super) fn with_results(
    f: &Function,
    extra: &[Value],
    cpu: &tcc_codegen::Cpu,
) -> Result<tcc_codegen::Executable, Error> {
    let mut g = f.clone();
    let mut results = g.results().to_vec();
    results.extend_from_slice(extra);
    g.set_results(results);
    tcc_codegen::compile(cpu, &g).map_err(|e| Error::input(format!("error: {e}")))
}

/// Each of `values`' range over the calibration `runs`, chosen by `method`.
pub(super) fn observe(
    f: &Function,
    cpu: &tcc_codegen::Cpu,
    runs: &[Vec<Tensor>],
    values: &[Value],
    method: Method,
    io: &mut Io,
) -> Result<HashMap<Value, Range>, Error> {
    let exe = with_results(f, values, cpu)?;
    let skip = f.results().len();
    let mut run_all = |what: &str, each: &mut dyn FnMut(usize, &[f32])| -> Result<(), Error> {
        // A progress line where a person watches; where the output goes to a file, just the
        // count at the end.
        let live = std::io::stderr().is_terminal();
        for (k, inputs) in runs.iter().enumerate() {
            if live {
                let _ = write!(io.stderr, "\r{what}: {}/{}", k + 1, runs.len());
                let _ = io.stderr.flush();
            }
            let out = exe
                .run(inputs)
                .map_err(|e| Error::input(format!("error: calibration run {}: {e}", k + 1)))?;
            for (i, t) in out[skip..].iter().enumerate() {
                if let tcc_ir::Data::F32(v) = t.data() {
                    each(i, v);
                }
            }
        }
        if live {
            let _ = writeln!(io.stderr);
        } else {
            let _ = writeln!(io.stderr, "{what}: {} runs", runs.len());
        }
        Ok(())
    };
    let mut lo = vec![f32::INFINITY; values.len()];
    let mut hi = vec![f32::NEG_INFINITY; values.len()];
    run_all("calibrating", &mut |i, v| {
        for &x in v {
            // NaN compares false both ways; an infinity makes the range fail later.
            lo[i] = lo[i].min(x);
            hi[i] = hi[i].max(x);
        }
    })?;
    if let Method::Percentile(pct) = method {
        let mut hist = vec![vec![0u64; BINS]; values.len()];
        let bin = |i: usize, x: f32| {
            let w = (hi[i] - lo[i]).max(f32::MIN_POSITIVE);
            (((x - lo[i]) / w * BINS as f32) as usize).min(BINS - 1)
        };
        run_all("histograms", &mut |i, v| {
            if !(lo[i].is_finite() && hi[i].is_finite()) {
                return;
            }
            for &x in v.iter().filter(|x| !x.is_nan()) {
                hist[i][bin(i, x)] += 1;
            }
        })?;
        for i in 0..values.len() {
            if !(lo[i].is_finite() && hi[i].is_finite()) {
                continue;
            }
            let total: u64 = hist[i].iter().sum();
            let cut = ((1.0 - pct / 100.0) * total as f64) as u64;
            let w = (hi[i] - lo[i]) / BINS as f32;
            let (mut below, mut a) = (0u64, 0usize);
            while a < BINS - 1 && below + hist[i][a] <= cut {
                below += hist[i][a];
                a += 1;
            }
            let (mut above, mut b) = (0u64, BINS - 1);
            while b > a && above + hist[i][b] <= cut {
                above += hist[i][b];
                b -= 1;
            }
            let (l, h) = (lo[i] + a as f32 * w, lo[i] + (b + 1) as f32 * w);
            lo[i] = l.max(lo[i]);
            hi[i] = h.min(hi[i]);
        }
    }
    if method == Method::Entropy {
        // Histograms of |x| over [0, max |x|]; each range clipped at the threshold the
        // entropy calibration picks (128 levels a side where the range has both signs, else
        // all 256 on the one).
        let amax: Vec<f32> = (0..values.len())
            .map(|i| lo[i].abs().max(hi[i].abs()))
            .collect();
        let ok = |i: usize| amax[i].is_finite() && amax[i] > 0.0;
        let mut hist = vec![vec![0u64; ENTROPY_BINS]; values.len()];
        run_all("histograms", &mut |i, v| {
            if !ok(i) {
                return;
            }
            let scale = ENTROPY_BINS as f32 / amax[i];
            // Exact zeros (half a relu's outputs) are on a level whatever the threshold, and
            // a spike in the first bin would draw the search to thresholds that clip the rest.
            for &x in v.iter().filter(|x| !x.is_nan() && **x != 0.0) {
                hist[i][((x.abs() * scale) as usize).min(ENTROPY_BINS - 1)] += 1;
            }
        })?;
        for i in (0..values.len()).filter(|&i| ok(i)) {
            let levels = if lo[i] < 0.0 && hi[i] > 0.0 { 128 } else { 256 };
            let t = ptq::entropy_threshold(&hist[i], amax[i], levels);
            lo[i] = lo[i].max(-t);
            hi[i] = hi[i].min(t);
        }
    }
    Ok((values.iter().enumerate())
        .map(|(i, &v)| {
            (
                v,
                Range {
                    min: lo[i],
                    max: hi[i],
                },
            )
        })
        .collect())
}
