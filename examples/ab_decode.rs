use embedding_kernels::formats::{to_bf16, to_f16, PackedTable, RowWise, TableRef};
use embedding_kernels::*;
fn main() {
    let which = std::env::args().nth(1).unwrap_or("int4".into());
    let (rows, dim, n) = (2048usize, 128usize, 16384usize);
    let table: Vec<f32> = (0..rows * dim)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut s = 12345u64;
    let ids: Vec<i64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % rows as u64) as i64
        })
        .collect();
    let bags = Bags::fixed(n / 16, 16).unwrap();
    let pooling = Pooling {
        mode: Mode::Sum,
        ..Pooling::default()
    };
    let f16t = to_f16(&table);
    let bf16t = to_bf16(&table);
    let i8b = RowWise::Int8.prepack(&table, dim).unwrap();
    let i4b = RowWise::Int4.prepack(&table, dim).unwrap();
    let t: TableRef = match which.as_str() {
        "f32" => TableRef::f32(&table, dim).unwrap(),
        "f16" => TableRef::f16(&f16t, dim).unwrap(),
        "bf16" => TableRef::bf16(&bf16t, dim).unwrap(),
        "int8" => PackedTable::new(RowWise::Int8, dim, &i8b).unwrap().into(),
        _ => PackedTable::new(RowWise::Int4, dim, &i4b).unwrap().into(),
    };
    let mut out = vec![0.0f32; n / 16 * dim];
    for _ in 0..10 {
        table_bag_forward_with(
            Parallelism::Serial,
            t,
            &ids,
            &bags,
            &pooling,
            &mut out,
            &mut [],
        )
        .unwrap();
    }
    println!("{}", out[0]);
}
