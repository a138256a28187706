// Predictions of `delta-predicted` chunks (spec §6.8), element by element.
//
// The spec asks for IEEE 754 binary32 operations rounded to nearest even, subnormals kept. WGSL
// promises neither (division and square root are only accurate to a few ulp, and subnormals may
// be flushed), so the five operations are done here in integer arithmetic, after Berkeley
// SoftFloat's algorithms (roundPackToF32, f32_mul; the division and square root bit by bit):
// the same bits as a CPU's float unit, on any GPU. Every NaN result is the canonical 0x7FC00000.

@group(0) @binding(0) var<storage, read> base: array<u32>;
@group(0) @binding(1) var<storage, read> in_m: array<u32>;      // the first moment the params name
@group(0) @binding(2) var<storage, read> in_other: array<u32>;
@group(0) @binding(3) var<storage, read_write> pred: array<u32>;
@group(0) @binding(4) var<uniform> job: Job;

struct Job {
    predictor: u32, // 1: adam-second-moment, 2: adam-parameter, 3 and 4: their reverses
    n: u32,         // elements
    skip: u32,      // elements of each binding before the first one (binding offsets are aligned)
    pad: u32,
    k: vec4<u32>,   // the constants' bit patterns
}

const WG: u32 = 64u;
const NAN: u32 = 0x7FC00000u;
const SIGN: u32 = 0x80000000u;

fn is_nan(a: u32) -> bool {
    return (a & 0x7FFFFFFFu) > 0x7F800000u;
}

fn shift_right_jam(a: u32, dist: u32) -> u32 {
    if (dist == 0u) {
        return a;
    }
    if (dist < 31u) {
        return (a >> dist) | select(0u, 1u, (a << (32u - dist)) != 0u);
    }
    return select(0u, 1u, a != 0u);
}

// A value sig × 2^(exp − 156), sig's leading one at bit 30 (or exp ≤ 0 for a subnormal result),
// rounded to nearest even and packed (SoftFloat's softfloat_roundPackToF32).
fn round_pack(sign: u32, exp_in: i32, sig_in: u32) -> u32 {
    var exp = exp_in;
    var sig = sig_in;
    if (exp < 0) {
        sig = shift_right_jam(sig, u32(-exp));
        exp = 0;
    } else if (exp > 0xFD || (exp == 0xFD && sig + 0x40u >= 0x80000000u)) {
        return (sign << 31u) | 0x7F800000u;
    }
    let round_bits = sig & 0x7Fu;
    sig = (sig + 0x40u) >> 7u;
    if (round_bits == 0x40u) {
        sig = sig & ~1u;
    }
    if (sig == 0u) {
        exp = 0;
    }
    return (sign << 31u) + (u32(exp) << 23u) + sig;
}

// A finite nonzero value's exponent field (1 for subnormals) and significand with its leading
// one at bit 23 once normalised: (exp, sig), value = sig × 2^(exp − 150).
fn unpack_norm(a: u32) -> vec2<i32> {
    let e = i32((a >> 23u) & 0xFFu);
    let m = a & 0x7FFFFFu;
    if (e == 0) {
        let shift = i32(countLeadingZeros(m)) - 8;
        return vec2<i32>(1 - shift, i32(m << u32(shift)));
    }
    return vec2<i32>(e, i32(m | 0x800000u));
}

// The 64-bit product of two u32s as (high, low).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xFFFFu;
    let a1 = a >> 16u;
    let b0 = b & 0xFFFFu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xFFFFu) + (p10 & 0xFFFFu);
    let lo = (p00 & 0xFFFFu) | (mid << 16u);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, lo);
}

fn f_mul(a: u32, b: u32) -> u32 {
    let sign = (a ^ b) >> 31u;
    let ma = a & 0x7FFFFFFFu;
    let mb = b & 0x7FFFFFFFu;
    if (is_nan(a) || is_nan(b)) {
        return NAN;
    }
    if (ma == 0x7F800000u || mb == 0x7F800000u) {
        if (ma == 0u || mb == 0u) {
            return NAN; // 0 × ∞
        }
        return (sign << 31u) | 0x7F800000u;
    }
    if (ma == 0u || mb == 0u) {
        return sign << 31u;
    }
    let ua = unpack_norm(a);
    let ub = unpack_norm(b);
    var exp = ua.x + ub.x - 0x7F;
    let p = mul_wide(u32(ua.y) << 7u, u32(ub.y) << 8u);
    var sig = p.x | select(0u, 1u, p.y != 0u);
    if (sig < 0x40000000u) {
        exp = exp - 1;
        sig = sig << 1u;
    }
    return round_pack(sign, exp, sig);
}

fn f_add(a: u32, b: u32) -> u32 {
    if (is_nan(a) || is_nan(b)) {
        return NAN;
    }
    var x = a;
    var y = b;
    // |x| ≥ |y|
    if ((y & 0x7FFFFFFFu) > (x & 0x7FFFFFFFu)) {
        x = b;
        y = a;
    }
    let mx = x & 0x7FFFFFFFu;
    let my = y & 0x7FFFFFFFu;
    let sx = x >> 31u;
    let sy = y >> 31u;
    if (mx == 0x7F800000u) {
        if (my == 0x7F800000u && sx != sy) {
            return NAN; // ∞ − ∞
        }
        return x;
    }
    if (my == 0u) {
        if (mx == 0u) {
            return (sx & sy) << 31u; // −0 only for −0 + −0
        }
        return x;
    }
    // value = sig × 2^(max(E, 1) − 150); six spare bits below the significands.
    let ex = max(i32(mx >> 23u), 1);
    let ey = max(i32(my >> 23u), 1);
    let gx = select(mx & 0x7FFFFFu, (mx & 0x7FFFFFu) | 0x800000u, (mx >> 23u) != 0u) << 6u;
    let gy = shift_right_jam(select(my & 0x7FFFFFu, (my & 0x7FFFFFu) | 0x800000u, (my >> 23u) != 0u) << 6u, u32(ex - ey));
    var s: u32;
    if (sx == sy) {
        s = gx + gy;
    } else {
        s = gx - gy;
    }
    if (s == 0u) {
        return 0u; // x − x = +0
    }
    let shift = i32(countLeadingZeros(s)) - 1;
    return round_pack(sx, ex - shift, s << u32(shift));
}

fn f_div(a: u32, b: u32) -> u32 {
    let sign = (a ^ b) >> 31u;
    let ma = a & 0x7FFFFFFFu;
    let mb = b & 0x7FFFFFFFu;
    if (is_nan(a) || is_nan(b)) {
        return NAN;
    }
    if (ma == 0x7F800000u) {
        if (mb == 0x7F800000u) {
            return NAN; // ∞ / ∞
        }
        return (sign << 31u) | 0x7F800000u;
    }
    if (mb == 0x7F800000u) {
        return sign << 31u;
    }
    if (mb == 0u) {
        if (ma == 0u) {
            return NAN; // 0 / 0
        }
        return (sign << 31u) | 0x7F800000u;
    }
    if (ma == 0u) {
        return sign << 31u;
    }
    let ua = unpack_norm(a);
    let ub = unpack_norm(b);
    var exp = ua.x - ub.x + 0x7E;
    var rem = u32(ua.y);
    let d = u32(ub.y);
    if (rem < d) {
        exp = exp - 1;
        rem = rem << 1u;
    }
    // 31 quotient bits, the first one set, then a sticky bit for the remainder.
    rem = rem - d;
    var q = 1u;
    for (var i = 0u; i < 30u; i = i + 1u) {
        rem = rem << 1u;
        q = q << 1u;
        if (rem >= d) {
            rem = rem - d;
            q = q | 1u;
        }
    }
    q = q | select(0u, 1u, rem != 0u);
    return round_pack(sign, exp, q);
}

fn f_sqrt(a: u32) -> u32 {
    if (is_nan(a)) {
        return NAN;
    }
    if ((a & 0x7FFFFFFFu) == 0u) {
        return a; // ±0
    }
    if ((a >> 31u) != 0u) {
        return NAN; // √ of a negative number
    }
    if (a == 0x7F800000u) {
        return a;
    }
    let u = unpack_norm(a);
    let e = u.x - 0x7F;
    // M = sig << 27 (e even) or << 28 (e odd): 52 bits, a 26-bit root, two bits at a time.
    let odd = (e & 1) != 0;
    let m = u32(u.y);
    var rem = 0u;
    var root = 0u;
    for (var i = 0; i < 26; i = i + 1) {
        // Bits 51 − 2i and 50 − 2i of M: from sig while they are above the shift, else zero.
        let hi_bit = 51 - 2 * i - select(27, 28, odd);
        var pair = 0u;
        if (hi_bit >= 1) {
            pair = (m >> u32(hi_bit - 1)) & 3u;
        } else if (hi_bit == 0) {
            pair = (m & 1u) << 1u;
        }
        rem = (rem << 2u) | pair;
        let trial = (root << 2u) | 1u;
        if (rem >= trial) {
            rem = rem - trial;
            root = (root << 1u) | 1u;
        } else {
            root = root << 1u;
        }
    }
    let sig = (root << 5u) | select(0u, 1u, rem != 0u);
    let s = select(27, 28, odd);
    return round_pack(0u, (e - 23 - s) / 2 + 151, sig);
}

fn f_sub(a: u32, b: u32) -> u32 {
    return f_add(a, b ^ SIGN);
}

@compute @workgroup_size(64)
fn predict(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = (wg.y * nwg.x + wg.x) * WG + lid;
    if (i >= job.n) {
        return;
    }
    let at = job.skip + i;
    let b = base[at];
    let m = in_m[at];
    let o = in_other[at];
    var p: u32;
    if (job.predictor == 1u) {
        // g = m' + ((m − m') / a); p = (b × β) + ((c × g) × g)
        let g = f_add(o, f_div(f_sub(m, o), job.k.x));
        p = f_add(f_mul(b, job.k.y), f_mul(f_mul(job.k.z, g), g));
    } else if (job.predictor == 2u) {
        // p = (b × d) + ((h × m) / ((√v / r) + e))
        p = f_add(f_mul(b, job.k.x), f_div(f_mul(job.k.w, m), f_add(f_div(f_sqrt(o), job.k.y), job.k.z)));
    } else if (job.predictor == 3u) {
        // g = m + ((m' − m) / a); p = (b − ((c × g) × g)) / β
        let g = f_add(m, f_div(f_sub(o, m), job.k.x));
        p = f_div(f_sub(b, f_mul(f_mul(job.k.z, g), g)), job.k.y);
    } else {
        // p = (b − ((h × m') / ((√v' / r) + e))) / d, m' and v' of the base
        p = f_div(f_sub(b, f_div(f_mul(job.k.w, m), f_add(f_div(f_sqrt(o), job.k.y), job.k.z))), job.k.x);
    }
    pred[at] = select(p, NAN, is_nan(p));
}
