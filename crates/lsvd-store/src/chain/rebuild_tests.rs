//! `rebuild` on its own, with a verifier that calls bytes starting with `BAD` bad:
//! what it repairs (a missing copy, a bad copy beside a good one) and what it leaves
//! and reports (no good copy; two good copies that differ).

use std::path::PathBuf;

use bytes::Bytes;

use super::drives::parse_spec;
use super::meta::Layout;
use super::rebuild::{Verdict, rebuild};
use crate::testutil::TempDir;
use crate::{PutMode, open_store};

fn verify(_key: &str, bytes: &[u8]) -> Verdict {
    if bytes.starts_with(b"BAD") {
        Verdict::Bad("starts with BAD".into())
    } else {
        Verdict::Good
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_repairs_what_has_a_good_copy_and_reports_the_rest() {
    let root = TempDir::new("chain-rebuild");
    let [a, a2]: [PathBuf; 2] = ["a", "a2"].map(|n| root.path().join(n));
    let spec = format!("{}+{}", a.display(), a2.display());
    let store = open_store(&format!("chain:{spec}")).expect("open");
    for k in ["missing", "bad", "both-good", "missing-and-bad", "both-bad"] {
        let key = format!("v/{k}");
        store
            .put(&key, Bytes::from(format!("good {k}")), PutMode::IfAbsent)
            .await
            .expect("put");
    }
    drop(store);
    let file = |dir: &PathBuf, k: &str| dir.join("v").join(k);
    std::fs::remove_file(file(&a2, "missing")).expect("rm");
    std::fs::write(file(&a, "bad"), b"BAD bytes").expect("write");
    std::fs::write(file(&a2, "both-good"), b"other good bytes").expect("write");
    std::fs::remove_file(file(&a, "missing-and-bad")).expect("rm");
    std::fs::write(file(&a2, "missing-and-bad"), b"BAD too").expect("write");
    std::fs::write(file(&a, "both-bad"), b"BAD same").expect("write");
    std::fs::write(file(&a2, "both-bad"), b"BAD same").expect("write");

    let spec = parse_spec("chain", &spec).expect("spec");
    let report = rebuild(&spec, Layout::Chain, &verify).expect("rebuild");
    assert_eq!(report.positions, 1);
    assert_eq!(report.keys, 5);
    let read = |dir: &PathBuf, k: &str| std::fs::read(file(dir, k)).ok();
    // Repaired from the good copy.
    assert_eq!(read(&a2, "missing").as_deref(), Some(&b"good missing"[..]));
    assert_eq!(read(&a, "bad").as_deref(), Some(&b"good bad"[..]));
    assert_eq!(report.repaired.len(), 2, "{:?}", report.repaired);
    // Left as they were, and reported.
    assert_eq!(
        read(&a, "missing-and-bad"),
        None,
        "a bad copy is not spread"
    );
    assert_eq!(
        read(&a2, "both-good").as_deref(),
        Some(&b"other good bytes"[..])
    );
    assert_eq!(
        read(&a, "both-good").as_deref(),
        Some(&b"good both-good"[..])
    );
    let unresolved = report.unresolved.join("\n");
    assert_eq!(report.unresolved.len(), 4, "{unresolved}");
    for (k, why) in [
        ("v/both-good", "cannot tell which to keep"),
        ("v/missing-and-bad", "no good copy"),
        ("v/both-bad", "no good copy"),
    ] {
        assert!(
            report
                .unresolved
                .iter()
                .any(|l| l.contains(&format!("{k}:")) && l.contains(why)),
            "{k}: {unresolved}"
        );
    }
    // The copies still hold different keys (missing-and-bad): said too.
    assert!(
        unresolved.contains("still hold different keys"),
        "{unresolved}"
    );
}
