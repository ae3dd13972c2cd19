//! Choosing what the JIT compiles for: the host, named by a target triple, with CPU features
//! that can be turned off (to test or to run the same code on older machines).
//!
//! A target spec is `host` or a triple (`x86_64-unknown-linux-gnu`), then optionally
//! `,-feature` items: `host,-fma,-avx2`. The JIT runs the code it compiles, so the triple's
//! architecture must be the host's, and features can only be removed, never added.

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use std::str::FromStr;
use target_lexicon::Triple;

/// The features a target spec may turn off that only the native kernels use: AVX-VNNI, which
/// the AVX2 int8 convolution uses where the target has AVX2 but not AVX-512F
/// (`host,-avx512f,-avxvnni` tests the `vpmaddubsw` path on a CPU that has it), and AMX, the
/// int8 convolution's tile multiplies (`host,-amx` tests the AVX-512 VNNI path on a CPU that
/// has AMX).
const KERNEL_ONLY: &[&str] = &["avxvnni", "amx"];

/// The x86-64 features the spec may turn off, as Cranelift names them without `has_`.
const X86_FEATURES: &[&str] = &[
    "sse3",
    "ssse3",
    "sse41",
    "sse42",
    "popcnt",
    "avx",
    "avx2",
    "fma",
    "bmi1",
    "bmi2",
    "lzcnt",
    "avx512f",
    "avx512dq",
    "avx512vl",
    "avx512bitalg",
    "avx512vbmi",
    "cmpxchg16b",
];

/// Builds the ISA for `spec` (`None` means the host with every feature it has).
pub(crate) fn isa(spec: Option<&str>) -> Result<OwnedTargetIsa, String> {
    let mut flags = settings::builder();
    for (k, v) in [
        ("opt_level", "speed"),
        ("is_pic", "false"),
        ("use_colocated_libcalls", "false"),
    ] {
        flags.set(k, v).map_err(|e| e.to_string())?;
    }
    let mut parts = spec.unwrap_or("host").split(',').map(str::trim);
    let name = parts.next().unwrap_or("host");
    let host = Triple::host();
    if name != "host" {
        let triple = Triple::from_str(name).map_err(|e| {
            format!(
                "`{name}` is not a target triple ({e}); use `host` or a triple such as `{host}`"
            )
        })?;
        if triple.architecture != host.architecture {
            return Err(format!(
                "target `{name}` is {}, but this machine is {}: the JIT runs the code it compiles, so it can only target the host",
                triple.architecture, host.architecture
            ));
        }
    }
    let mut isa = cranelift_native::builder()
        .map_err(|e| format!("this CPU is not supported by Cranelift: {e}"))?;
    for item in parts {
        let Some(feature) = item.strip_prefix('-') else {
            return Err(if item.starts_with('+') {
                format!(
                    "`{item}`: features can only be turned off (`-name`); the JIT already uses every feature this CPU has"
                )
            } else {
                format!("`{item}`: expected `-feature` after the triple")
            });
        };
        let feature = feature.trim_start_matches("has_").replace('.', "");
        if KERNEL_ONLY.contains(&feature.as_str()) {
            // A feature of the native kernels, not of the code Cranelift writes.
            continue;
        }
        if !X86_FEATURES.contains(&feature.as_str()) {
            return Err(format!(
                "unknown CPU feature `{feature}`; the features are {}, {}",
                X86_FEATURES.join(", "),
                KERNEL_ONLY.join(", ")
            ));
        }
        isa.set(&format!("has_{feature}"), "false")
            .map_err(|e| format!("cannot turn off `{feature}`: {e}"))?;
    }
    isa.finish(settings::Flags::new(flags))
        .map_err(|e| format!("cannot build the target: {e}"))
}

/// The x86-64 features compiled code may use: the host's, less those a target spec turns off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// 256-bit vectors.
    pub avx: bool,
    /// 256-bit integer vectors.
    pub avx2: bool,
    /// Fused multiply-add.
    pub fma: bool,
    /// 512-bit vectors.
    pub avx512f: bool,
    /// Whether the library kernels (our GEMM, the blocked convolutions' tiles) use 512-bit
    /// vectors: AVX-512F, on a CPU that runs them at full width unless [`VectorWidth`] says
    /// otherwise. Without it they use 256-bit AVX2+FMA code.
    pub wide: bool,
    /// AVX-512 VNNI or AVX-VNNI (int8 dot products): the integer product (`matmul_integer`)
    /// uses AVX-512 VNNI where the target also has AVX-512F.
    pub vnni: bool,
    /// AVX-VNNI (`vpdpbusd` on 256-bit vectors, VEX-encoded), unless the target spec turns it
    /// off (`-avxvnni`): the AVX2 int8 convolution uses it where the target has AVX2 but not
    /// AVX-512F.
    pub avx_vnni: bool,
    /// AMX-INT8 (`tdpbsud` on 16 x 64-byte tiles), where the CPU has it, the kernel lets this
    /// process use it and the target spec does not turn it off (`-amx`): the int8
    /// convolution uses it where the target has AVX-512 VNNI.
    pub amx: bool,
}

impl Features {
    /// The features for a target spec (`None`: the host with everything it has).
    pub fn of(spec: Option<&str>) -> Result<Features, String> {
        let flags = isa(spec)?.isa_flags();
        let on = |name: &str| (flags.iter()).any(|v| v.name == name && v.as_bool() == Some(true));
        #[cfg(target_arch = "x86_64")]
        let vnni =
            std::is_x86_feature_detected!("avx512vnni") || std::is_x86_feature_detected!("avxvnni");
        #[cfg(not(target_arch = "x86_64"))]
        let vnni = false;
        #[cfg(target_arch = "x86_64")]
        let avx_vnni = std::is_x86_feature_detected!("avxvnni");
        #[cfg(not(target_arch = "x86_64"))]
        let avx_vnni = false;
        let off = |name: &str| {
            (spec.unwrap_or("").split(',').skip(1))
                .any(|p| p.trim().trim_start_matches('-').trim_start_matches("has_") == name)
        };
        #[cfg(target_arch = "x86_64")]
        let amx = super::native::amx::available();
        #[cfg(not(target_arch = "x86_64"))]
        let amx = false;
        Ok(Features {
            avx_vnni: avx_vnni && !off("avxvnni"),
            amx: amx && !off("amx"),
            avx: on("has_avx"),
            avx2: on("has_avx2"),
            fma: on("has_fma"),
            avx512f: on("has_avx512f"),
            wide: on("has_avx512f") && !halved_512(),
            vnni,
        })
    }

    /// These features with the library kernels' vector width as `width` asks.
    pub fn with_width(self, width: VectorWidth) -> Features {
        let wide = match width {
            VectorWidth::Auto => self.wide,
            VectorWidth::W256 => false,
            VectorWidth::W512 => self.avx512f,
        };
        Features { wide, ..self }
    }

    /// The names of the features code may use, as CPU manuals write them, in a fixed order
    /// (VNNI where the integer product uses it: with AVX-512F).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.avx, "AVX"),
            (self.avx2, "AVX2"),
            (self.fma, "FMA"),
            (self.avx512f, "AVX-512F"),
            (self.avx512f && self.vnni, "VNNI"),
            (self.avx2 && !self.avx512f && self.avx_vnni, "AVX-VNNI"),
            (self.avx512f && self.vnni && self.amx, "AMX-INT8"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// The vector width of the library kernels (our GEMM, the blocked convolutions' register
/// tiles), as compilers' `-mprefer-vector-width`: the JIT's own kernels are not affected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VectorWidth {
    /// 512 bits where the target has AVX-512F and the CPU runs 512-bit operations at full
    /// width; 256 elsewhere, including AMD's Zen 4, which runs them as two halves and where
    /// the 256-bit kernels measured faster (docs/perf.md).
    #[default]
    Auto,
    /// 256-bit (AVX2+FMA) kernels.
    W256,
    /// 512-bit kernels wherever the target has AVX-512F.
    W512,
}

impl std::str::FromStr for VectorWidth {
    type Err = String;

    fn from_str(s: &str) -> Result<VectorWidth, String> {
        match s {
            "auto" => Ok(VectorWidth::Auto),
            "256" => Ok(VectorWidth::W256),
            "512" => Ok(VectorWidth::W512),
            _ => Err(format!(
                "unknown vector width `{s}`; the widths are auto, 256 and 512"
            )),
        }
    }
}

/// Whether this CPU runs 512-bit multiply-adds as two 256-bit halves: AMD's family 19h (Zen 4;
/// its Zen 3 parts have no AVX-512). There the 512-bit kernels have no more multiply-add
/// throughput than the 256-bit ones and measured slower: the GEMM 3-13% on the same products
/// (sgemm 1024 to 2048, 64x4096x4096, 128x768x3072), the convolutions' tiles up to 14% on 1x1
/// layers. Zen 5 (family 1Ah) and Intel's server cores have full-width units.
fn halved_512() -> bool {
    // CPUID traps to the hypervisor in a VM: ask once, not for every function compiled.
    static HALVED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HALVED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            let (vendor, signature) = (__cpuid(0), __cpuid(1));
            let amd = [vendor.ebx, vendor.edx, vendor.ecx]
                == [
                    u32::from_le_bytes(*b"Auth"),
                    u32::from_le_bytes(*b"enti"),
                    u32::from_le_bytes(*b"cAMD"),
                ];
            let base = (signature.eax >> 8) & 0xf;
            let family = if base == 0xf {
                base + ((signature.eax >> 20) & 0xff)
            } else {
                base
            };
            amd && family == 0x19
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
