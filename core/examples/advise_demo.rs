fn main() {
    let q = std::env::args().nth(1).unwrap();
    let limit: usize = std::env::args().nth(2).map_or(8, |s| s.parse().unwrap());
    let state = estimator_core::decode_query(&q).state;
    let t = std::time::Instant::now();
    let plans = estimator_core::fit_advice(&state, limit).unwrap();
    eprintln!("{:?}", t.elapsed());
    for p in plans {
        println!(
            "{:?} {:?} peak={} batch={} max={:?}\n   {}",
            p.rank.tier,
            p.changes.iter().map(|c| c.label()).collect::<Vec<_>>(),
            p.peak_bytes,
            p.batch,
            p.max_batch,
            estimator_core::encode_query(&p.state)
        );
    }
}
