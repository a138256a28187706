//! A delta round trip against an arbitrary base: the current tensor is the base with arbitrary
//! edits on its bit patterns; written with an arbitrary delta encoder (or the writer's own
//! choice), read back against the base: bit-exact, and verified.

use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use tpde_codec::Encoder;
use tpde_format::{BaseRef, CodecTag, DType};
use tpde_read::Reader;
use tpde_write::{WriteOptions, Writer};

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub dtype: u8,
    pub encoder: u8,
    pub chunk_kib: u8,
    pub base: Vec<u8>,
    /// (element, XOR mask) edits of the base.
    pub edits: Vec<(u16, u64)>,
}

/// One of the codecs that decode against a base, or one of the writer's own choices.
fn encoder(selector: u8) -> Encoder {
    let deltas: Vec<CodecTag> =
        CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted).collect();
    let i = selector as usize % (deltas.len() + 2);
    deltas.get(i).map_or(if i == deltas.len() { Encoder::AutoSerial } else { Encoder::Auto }, |&t| Encoder::Codec(t))
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let dtype = DType::ALL[input.dtype as usize % DType::ALL.len()];
    let w = dtype.size() as usize;
    let n = input.base.len() / w;
    let base = &input.base[..n * w];
    let mut current = base.to_vec();
    for &(at, mask) in &input.edits {
        if n == 0 {
            break;
        }
        let i = at as usize % n;
        for (j, b) in current[i * w..(i + 1) * w].iter_mut().enumerate() {
            *b ^= (mask >> (8 * (j % 8))) as u8;
        }
    }
    let shape = [n as u64];

    let mut base_file = Writer::new(Vec::new(), WriteOptions::default()).expect("writer");
    base_file.add_tensor("t", dtype, &shape, base).expect("base tensor");
    let base_reader = Reader::from_source(base_file.finish().expect("base file")).expect("base opens");

    let options = WriteOptions {
        encoder: encoder(input.encoder),
        chunk_bytes: (u64::from(input.chunk_kib % 16) + 1) * 1024,
        base: Some(BaseRef { digest: base_reader.content_digest(), path_hint: String::new() }),
        ..WriteOptions::default()
    };
    let mut wr = Writer::new(Vec::new(), options).expect("writer");
    wr.add_tensor_delta("t", dtype, &shape, &current, base).expect("delta tensor");
    let file = wr.finish().expect("delta file");
    let r =
        Reader::from_source(file.as_slice()).expect("delta opens").with_base(Arc::new(base_reader)).expect("base fits");
    assert_eq!(&*r.read("t").expect("decodes"), current.as_slice(), "{dtype} delta not bit-exact");
    r.verify().expect("verifies");
}
