//! The demo in examples/: a Mandelbrot zoom that survives a driver crash mid-run.

use cloister_tests::*;

#[test]
fn mandelbrot_survives_a_crash_in_frame_five() {
    let exe = c_program(&workspace_root().join("examples/mandelbrot.c"));
    let driver = fault_driver();
    let dir = std::env::temp_dir().join(format!("cloister-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("direct")).unwrap();
    std::fs::create_dir_all(dir.join("caged")).unwrap();
    let fault = [("CLOISTER_FAULT", "enqueue:segv:once"), ("CLOISTER_FAULT_SKIP", "5")];

    // Directly, the crash in frame 5 kills the program.
    let vendors = vendors_dir_for(&driver);
    let mut env = fault.to_vec();
    env.push(("OCL_ICD_VENDORS", vendors.to_str().unwrap()));
    // `:once` keeps its marker in $HOME: a fresh one, so the fault fires in this run.
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    env.push(("HOME", home.to_str().unwrap()));
    let d = direct(&exe, &["8", dir.join("direct").to_str().unwrap()], &env);
    assert!(!d.status.success(), "{}", text(&d));
    assert!(!dir.join("direct/frame05.ppm").exists());

    // Caged in report mode, it recreates its context and renders every frame.
    let mut env = fault.to_vec();
    env.push(("CLOISTER_RECOVERY", "report"));
    let cache = dir.join("cache");
    env.push(("XDG_CACHE_HOME", cache.to_str().unwrap()));
    let c = caged_on_faultcl(&exe, &["8", dir.join("caged").to_str().unwrap()], &env);
    let t = text(&c);
    assert!(c.status.success(), "{t}");
    assert!(t.contains("frame 5: the driver is gone") && t.contains("recovered from 1 driver crash"), "{t}");
    for f in 0..8 {
        let frame = std::fs::read(dir.join(format!("caged/frame{f:02}.ppm"))).unwrap();
        assert_eq!(frame.len(), "P6 320 240 255\n".len() + 320 * 240 * 3, "frame {f}");
    }
    // The frame rendered after the restart is the one the first worker would have rendered.
    let again = std::fs::read(dir.join("caged/frame05.ppm")).unwrap();
    let clean = caged(&[], &exe, &["8", dir.join("direct").to_str().unwrap()], &[]);
    assert!(clean.status.success(), "{}", text(&clean));
    assert_eq!(again, std::fs::read(dir.join("direct/frame05.ppm")).unwrap(), "frame 5 differs after recovery");
    let _ = std::fs::remove_dir_all(&dir);
}
