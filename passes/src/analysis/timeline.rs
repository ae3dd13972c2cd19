//! The predicted time of a scheduled function on two streams, compute and copy: what a step
//! with swaps costs (the model issue 17's joint planner minimises).
//!
//! The ops run in schedule order. Every op but a swap runs on the compute stream for the time
//! model's [`Machine::kernel_time`] (its FLOPs weighted as [`time_flops`] says, its operands
//! and results moved from and to memory); ops that only relabel a buffer ([`is_free`]) take
//! none. A `swap_out` or `swap_in` is handed to the copy stream when the compute stream reaches
//! it and runs there, one copy at a time in schedule order, for its bytes over the link. An op
//! that reads a `swap_in`'s result waits for that copy: the wait is a stall. The compute
//! stream's end, with the copy stream's last copy if that ends later, is the step's time.
//!
//! What this leaves out: kernels fused by a backend (each op is its own kernel here), the
//! copies' use of memory bandwidth the compute shares, and a swap-out's wait before its
//! memory is reused (the op-level memory model frees it at the `swap_out`).

use super::cost::{Machine, Traffic, is_free, time_flops};
use cranelift_entity::SecondaryMap;
use tcc_ir::{Function, Op, OpKind, Value};

/// The predicted time of a function, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timeline {
    /// Time the compute stream spends computing.
    pub compute: f64,
    /// Time the copy stream spends copying.
    pub copies: f64,
    /// Time the compute stream waits for copies.
    pub stalls: f64,
    /// The step: when both streams are done.
    pub total: f64,
}

impl Timeline {
    /// The share of the copies' time hidden behind compute (1 without copies).
    pub fn hidden(&self) -> f64 {
        if self.copies > 0.0 {
            (1.0 - self.stalls / self.copies).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// The timeline of `f` on machine `m` with a link of `link_gbps` GB/s for the copies.
pub fn timeline(f: &Function, m: &Machine, link_gbps: f64) -> Timeline {
    let mut t = Timeline::default();
    // When each swap-in's copy is done.
    let mut ready: SecondaryMap<Value, f64> = SecondaryMap::with_capacity(f.num_values_created());
    let (mut now, mut copy_free) = (0.0f64, 0.0f64);
    for &op in f.schedule() {
        let d = f.op(op);
        let bytes = |vs: &[Value]| vs.iter().map(|&v| f.ty(v).size_bytes()).sum::<u64>();
        if d.kind.is_swap() {
            let secs = bytes(&d.results) as f64 / (link_gbps * 1e9);
            let start = now.max(copy_free);
            copy_free = start + secs;
            t.copies += secs;
            if matches!(d.kind, OpKind::SwapIn) {
                ready[d.results[0]] = copy_free;
            }
            continue;
        }
        let wait = d.args.iter().map(|&a| ready[a]).fold(now, f64::max);
        t.stalls += wait - now;
        now = wait;
        let secs = compute_time(f, op, m);
        t.compute += secs;
        now += secs;
    }
    t.total = now.max(copy_free);
    t
}

/// Seconds `op` takes on the compute stream: the time model's kernel time, none for a swap
/// (the copy stream's) or an op that only relabels a buffer.
pub fn compute_time(f: &Function, op: Op, m: &Machine) -> f64 {
    let d = f.op(op);
    if d.kind.is_swap() || is_free(&d.kind) {
        return 0.0;
    }
    let args: Vec<_> = d.args.iter().map(|&a| f.ty(a)).collect();
    let results: Vec<_> = d.results.iter().map(|&r| f.ty(r)).collect();
    let flops = time_flops(&d.kind, &args, &results);
    let moved = (args.iter().chain(&results)).map(|t| t.size_bytes()).sum();
    m.kernel_time(&d.kind, flops, Traffic::memory(moved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcc_ir::parse_function;

    /// A machine where a 1024-element add takes 1 µs plus no launch (1 GFLOP/s of vector work
    /// against memory fast enough not to matter) and 4 KiB cross the link in 1 µs at 4.096
    /// GB/s.
    const M: Machine = Machine {
        gflops: 1.0,
        vector_gflops: 1.024,
        gbps: 1e6,
        launch_us: 0.0,
        sync_us: 0.0,
        cache_mib: 32.0,
        cache_gbps: 1e6,
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn copies_overlap_compute_and_readers_wait_for_them() {
        // Five adds of 1 µs each; %a's swap-out (1 µs) runs during %b, its swap-in (1 µs)
        // starts after %c and is done during %d, before %e reads it: nothing stalls.
        let src = |late: bool| {
            let (early, last) = if late {
                ("", "  %i = swap_in %h : f32[1024]\n")
            } else {
                ("  %i = swap_in %h : f32[1024]\n", "")
            };
            parse_function(&format!(
                "func @f(%x: f32[1024]) -> (f32[1024]) {{
  %a = add %x, %x : f32[1024]
  %h = swap_out %a : f32[1024]
  %b = add %x, %x : f32[1024]
  %c = add %b, %x : f32[1024]
{early}  %d = add %c, %x : f32[1024]
{last}  %e = add %i, %d : f32[1024]
  return %e
}}"
            ))
            .unwrap()
        };
        let hidden = src(false);
        let t = timeline(&hidden, &M, 4.096);
        assert!(close(t.compute, 5e-6) && close(t.copies, 2e-6), "{t:?}");
        assert!(close(t.stalls, 0.0) && close(t.total, 5e-6), "{t:?}");
        assert!(close(t.hidden(), 1.0));
        // The swap-in issued just before its reader: the reader waits the whole copy, 1 µs.
        let late = src(true);
        let t = timeline(&late, &M, 4.096);
        assert!(close(t.stalls, 1e-6) && close(t.total, 6e-6), "{t:?}");
        assert!(close(t.hidden(), 0.5));
        // A slower link (half the rate): the swap-out takes 2 µs, and the swap-in, issued
        // after %c at 3 µs, queues behind nothing and ends at 5 µs, after %d: %e waits 1 µs.
        let t = timeline(&hidden, &M, 2.048);
        assert!(close(t.copies, 4e-6) && close(t.stalls, 1e-6), "{t:?}");
    }
}
