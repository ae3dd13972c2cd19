//! AMX-INT8 for the int8 convolution ([`super::vnni_conv`]): its filter rows times its packed
//! pixel blocks on tiles instead of 512-bit registers.
//!
//! AMX has eight tile registers of up to 16 rows of 64 bytes; `tdpbsud c, a, b` adds to each
//! i32 `c[i][j]` the products of the 64 signed bytes of `a`'s row `i` with column `j` of `b`,
//! `b`'s rows holding 4 bytes per column (the 4-tap steps `vpdpbusd` also reads, so the VNNI
//! kernel's packed blocks are `b` tiles as they are: a 64-byte half of each 128-byte step,
//! 16 steps a tile). One instruction is 16 x 16 x 64 multiply-adds, eight times a 512-bit
//! `vpdpbusd`'s per cycle. The register tile is 32 channels x 32 pixels: four accumulator
//! tiles, two filter tiles, two pixel tiles. Sums wrap in i32 as the interpreter's do.
//!
//! Rust has no stable AMX intrinsics, so the instructions are inline assembly. Linux keeps a
//! process from using tile data until it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM)`):
//! [`available`] asks once, and AMX is used only where that succeeded.

use crate::cpu::bytes::Line;
use std::arch::asm;

/// Whether the CPU has AMX-TILE and AMX-INT8 and the operating system lets this process use
/// them (asked once).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let max = std::arch::x86_64::__cpuid(0).eax;
        // CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
        max >= 7 && (std::arch::x86_64::__cpuid_count(7, 0).edx >> 24) & 3 == 3 && permit()
    })
}

/// Asks Linux for the tile data state (`XFEATURE_XTILEDATA`, 18) for this process.
#[cfg(target_os = "linux")]
fn permit() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the request only changes which register state the kernel saves for the process.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn permit() -> bool {
    false
}

/// The tile configuration: palette 1, each of the eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

static CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// The tiles configured on this thread while it lives; released when it is dropped (so that
/// the thread's saved state is small again). Not `Send`: the configuration is the thread's.
pub(super) struct Tiles(std::marker::PhantomData<*const ()>);

impl Tiles {
    /// Configures the tiles.
    ///
    /// # Safety
    /// [`available`] is true.
    pub(super) unsafe fn load() -> Tiles {
        // SAFETY: the caller's contract; `CONFIG` is a valid 64-byte configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
        Tiles(std::marker::PhantomData)
    }

    /// `out[i][j]` = the sum over `chunks * 64` taps of filter row `i` (32 rows of i8,
    /// `stride` bytes apart) times pixel `j` of a packed block (`chunks * 16` 4-tap steps of
    /// 32 pixels x 4 u8, 128 bytes a step), wrapping.
    ///
    /// # Safety
    /// `rows` reaches 32 rows of `chunks * 64` bytes, `stride` apart; `panel` holds
    /// `chunks * 2048` bytes.
    pub(super) unsafe fn product(
        &self,
        rows: *const i8,
        stride: usize,
        panel: *const u8,
        chunks: usize,
        out: &mut Sums,
    ) {
        // SAFETY: the tiles are configured (`self`), the loads in range as the contract says.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for j in 0..chunks {
                asm!(
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b} + {sb}*1 + 64]",
                    "tdpbsud tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a2} + {sa}*1]",
                    "tdpbsud tmm1, tmm4, tmm7",
                    "tdpbsud tmm2, tmm5, tmm6",
                    "tdpbsud tmm3, tmm5, tmm7",
                    a = in(reg) rows.add(64 * j),
                    a2 = in(reg) rows.add(64 * j + 16 * stride),
                    sa = in(reg) stride,
                    b = in(reg) panel.add(2048 * j),
                    sb = in(reg) 128usize,
                    options(nostack, readonly)
                );
            }
            asm!(
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{c} + {s}*1 + 64], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c2} + {s}*1 + 64], tmm3",
                c = in(reg) out.0.as_mut_ptr(),
                c2 = in(reg) out.0[16..].as_mut_ptr(),
                s = in(reg) 128usize,
                options(nostack)
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// A 32 x 32 tile of sums, aligned for the tile stores.
#[repr(C, align(64))]
pub(super) struct Sums(pub [[i32; 32]; 32]);

/// A filter's rows as [`Tiles::product`] reads them: each padded with zeros to a multiple of
/// 64 taps (`stride` bytes), aligned (AMX loads its tiles from aligned rows 2.6 times as fast
/// as from unaligned ones), and 32 zero rows after them (a tile of 32 from any row is in
/// range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TileRows {
    rows: Vec<Line>,
    pub stride: usize,
}

impl TileRows {
    /// `o` rows of `kp` shifted taps.
    pub(super) fn new(rows: &[i8], kp: usize) -> TileRows {
        let stride = kp.div_ceil(64) * 64;
        let o = rows.len() / kp.max(1);
        let mut tiled = crate::cpu::bytes::lines(((o + 32) * stride) as u64);
        let base = tiled.as_mut_ptr() as *mut i8;
        for (i, s) in rows.chunks(kp).enumerate() {
            // SAFETY: row `i < o` of `stride >= kp` bytes is inside `tiled`.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), base.add(i * stride), kp) };
        }
        TileRows {
            rows: tiled,
            stride,
        }
    }

    /// The first row.
    pub(super) fn ptr(&self) -> *const i8 {
        self.rows.as_ptr() as *const i8
    }
}
