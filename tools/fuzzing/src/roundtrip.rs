//! A structured round trip: tensors and metadata derived with `arbitrary`, written with an
//! arbitrary encoder, chunk size and alignment, read back: equal, and the file verifies.

use arbitrary::{Arbitrary, Unstructured};
use tpde_codec::Encoder;
use tpde_format::{CodecTag, DType, MetadataValue};
use tpde_read::Reader;
use tpde_write::{WriteOptions, Writer};

/// A tensor as the fuzzer describes it; [`Tensor::shape`] and [`Tensor::data`] make it valid.
#[derive(Arbitrary, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: u8,
    pub dims: Vec<u8>,
    pub seed: Vec<u8>,
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        DType::ALL[self.dtype as usize % DType::ALL.len()]
    }
    /// At most 4 dimensions of at most 63: at most 16 M elements, capped below.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().take(4).map(|&d| u64::from(d % 64)).collect()
    }
    /// The logical bytes: the seed repeated to the length the shape needs, or `None` when that
    /// is more than the target wants to allocate.
    pub fn data(&self) -> Option<Vec<u8>> {
        let n = self.shape().iter().product::<u64>() * self.dtype().size();
        if n > 1 << 20 {
            return None;
        }
        let seed = if self.seed.is_empty() { &[0x5a][..] } else { &self.seed };
        Some(seed.iter().copied().cycle().take(n as usize).collect())
    }
}

#[derive(Arbitrary, Debug)]
pub enum Value {
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(u64),
    String(String),
    Bytes(Vec<u8>),
}

impl From<&Value> for MetadataValue {
    fn from(v: &Value) -> Self {
        match v {
            Value::Bool(b) => MetadataValue::Bool(*b),
            Value::U64(x) => MetadataValue::U64(*x),
            Value::I64(x) => MetadataValue::I64(*x),
            Value::F64(bits) => MetadataValue::F64(f64::from_bits(*bits)),
            Value::String(s) => MetadataValue::String(s.clone()),
            Value::Bytes(b) => MetadataValue::Bytes(b.clone()),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub encoder: u8,
    pub level: i8,
    pub chunk_kib: u8,
    pub alignment_log2: u8,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Tensor>,
}

/// The keyframe encoders: a delta one needs a base (see `delta_roundtrip`).
pub fn keyframe_encoder(selector: u8, level: i8) -> Encoder {
    match selector % 6 {
        0 => Encoder::Raw,
        1 => Encoder::Zstd { level: i32::from(level % 8) },
        2 => Encoder::Codec(CodecTag::Planes),
        3 => Encoder::Codec(CodecTag::PlanesLanes),
        4 => Encoder::AutoSerial,
        _ => Encoder::Auto,
    }
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let options = WriteOptions {
        encoder: keyframe_encoder(input.encoder, input.level),
        chunk_bytes: (u64::from(input.chunk_kib) + 1) * 1024,
        alignment: 64 << (input.alignment_log2 % 5),
        base: None,
        min_minor_version: 0,
    };
    let mut w = Writer::new(Vec::new(), options).expect("valid options");
    let mut metadata = Vec::new();
    for (key, value) in &input.metadata {
        let value = MetadataValue::from(value);
        // The writer refuses empty, repeated, over-long and wrongly typed reserved keys: those
        // are refusals, not bugs, and the entry is left out.
        if w.add_metadata(key.clone(), value.clone()).is_ok() {
            metadata.push((key.clone(), value));
        }
    }
    let mut written = Vec::new();
    for t in &input.tensors {
        let Some(bytes) = t.data() else { continue };
        if w.add_tensor(&t.name, t.dtype(), &t.shape(), &bytes).is_ok() {
            written.push((t, bytes));
        }
    }
    let file = w.finish().expect("a writer that accepted everything finishes");
    let r = Reader::from_source(file.as_slice()).expect("the writer's file opens");
    assert_eq!(r.tensors().len(), written.len());
    for (entry, (t, bytes)) in r.tensors().iter().zip(&written) {
        assert_eq!((entry.name.as_str(), entry.dtype, &entry.shape), (t.name.as_str(), t.dtype(), &t.shape()));
        assert_eq!(&*r.read_tensor(entry).expect("reads"), bytes.as_slice(), "tensor {:?}", t.name);
    }
    for (key, value) in &metadata {
        assert!(r.metadata(key).is_some_and(|v| v.same_bits(value)), "metadata {key:?}");
    }
    r.verify().expect("the writer's file verifies");
}
