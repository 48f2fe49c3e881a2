#!/usr/bin/python3
"""Unit tests of scripts/gpu_figures.py: what scripts/gpu-check.sh reads its figures with, on
files shaped as ctest, `trainer mem --json`, `trainer bench --csv` and peer_bench.py write them.
Run: /usr/bin/python3 scripts/gpu_figures_test.py"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_figures.py")

CTEST = """Test project /tmp/trainer-gpu/build
      Start 218: OnGpu.NvmlListsTheGpuTheCudaRuntimeUsesWithThisProcessOnIt
 1/4 Test #218: OnGpu.NvmlListsTheGpuTheCudaRuntimeUsesWithThisProcessOnIt ........   Passed    1.20 sec
 2/4 Test #223: GpuHog.HoldsMemory ..........................................***Not Run (Disabled)   0.00 sec
 3/4 Test #229: Devices/OnDevice.OutOfMemoryInTheForward/cuda0  # GetParam() = "cuda:0" ....{state}   2.10 sec
 4/4 Test #230: Devices/OnDevice.OutOfMemoryInTheForward/cpu  # GetParam() = "cpu" ...........   Passed    3.00 sec
"""

CSV_HEADER = ("training.micro_batch_size,status,micro_batch_used,samples_per_s,step_ms_median,step_ms_min,"
              "step_ms_max,peak_mib,predicted_peak_mib,out_of_memory,measured_steps,note\n")


class GpuFigures(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def figure(self, *args):
        r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        return r.returncode, r.stdout.strip()

    def test_cuda_tests_pass_only_when_none_skipped(self):
        code, fig = self.figure("cuda-tests", self.write("ok.log", CTEST.format(state="   Passed")))
        self.assertEqual((code, fig), (0, "3_passed_0_skipped_0_failed"))
        code, fig = self.figure("cuda-tests", self.write("skip.log", CTEST.format(state="***Skipped")))
        self.assertEqual(code, 1)
        self.assertIn("1_skipped", fig)
        self.assertIn("OnDevice.OutOfMemoryInTheForward/cuda0", fig)
        code, fig = self.figure("cuda-tests", self.write("fail.log", CTEST.format(state="***Failed")))
        self.assertEqual(code, 1)
        self.assertIn("1_failed", fig)
        code, fig = self.figure("cuda-tests", self.write("abort.log", CTEST.format(state="Subprocess aborted***Exception")))
        self.assertEqual(code, 1)
        self.assertIn("1_failed", fig)
        self.assertEqual(self.figure("cuda-tests", self.write("none.log", "No tests were found!!!\n"))[0], 1)

    def test_mem_needs_a_gpu_from_nvml(self):
        gpu = {"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "total_bytes": 85 << 30,
               "free_bytes": 80 << 30}
        code, fig = self.figure("mem", self.write("m.json", json.dumps({"source": "nvml", "devices": [gpu]})))
        self.assertEqual(code, 0)
        self.assertIn("cuda:0=NVIDIA_H100_80GB_HBM3:GPU-1234", fig)
        none = {"source": "none", "notes": ["NVML: cannot load libnvidia-ml.so.1"], "devices": [{"device": "cpu"}]}
        code, fig = self.figure("mem", self.write("n.json", json.dumps(none)))
        self.assertEqual(code, 1)
        self.assertIn("cannot load", fig)

    def test_bench_and_estimate_read_the_csv(self):
        csv = self.write("b.csv", CSV_HEADER + "512,ok,512,9000.5,56.1,50,60,1000,1050,false,5,\n"
                                              "4096,ok,4096,12000,300,290,310,4000,4100,false,5,\n")
        code, fig = self.figure("bench", csv)
        self.assertEqual(code, 0)
        self.assertIn("micro_batch_size=512:9000_samples/s,56.10_ms,1000_MiB_peak", fig)
        code, fig = self.figure("estimate", csv)
        self.assertEqual(code, 0)
        self.assertIn("micro_batch_size=4096:predicted_4100_measured_4000_MiB_(+2.5%)", fig)
        off = self.write("off.csv", CSV_HEADER + "4096,ok,4096,12000,300,290,310,4000,5000,false,5,\n")
        self.assertEqual(self.figure("estimate", off)[0], 1)  # 25 % off
        oom = self.write("oom.csv", CSV_HEADER + "4096,out of memory,,,,,,,,true,0,\n")
        self.assertEqual(self.figure("bench", oom)[0], 1)
        self.assertEqual(self.figure("bench", self.write("missing.csv", "garbage\n"))[0], 1)

    def test_estimate_offload_compares_the_rung_with_the_offloaded_cell(self):
        mib = 2**20
        rung = {"micro_batch_size": 128, "checkpointed_blocks": 0, "moment_bits": 0, "time_ratio": 1.0,
                "inexact": False}
        est = {"ladder": {"rungs": [dict(rung, peak_bytes=1000 * mib, offload=False),
                                    dict(rung, checkpointed_blocks=2, peak_bytes=900 * mib, offload=False),
                                    dict(rung, peak_bytes=800 * mib, offload=True, time_ratio=1.2)]}}
        header = CSV_HEADER.replace("training.micro_batch_size", "plugins.oom_backoff.start_offload")
        csv = self.write("o.csv", header + "false,ok,128,900,50,49,51,1020,1000,false,20,\n"
                                           "true,ok,128,700,60,59,61,780,1000,false,20,\n")
        code, fig = self.figure("estimate-offload", self.write("e.json", json.dumps(est)), csv)
        self.assertEqual(code, 0, fig)
        self.assertEqual(fig, "as_configured:predicted_1000_measured_1020_MiB_(-2.0%);"
                              "offload:predicted_800_measured_780_MiB_(+2.6%);"
                              "saving:predicted_200_measured_240_MiB_(-16.7%)")
        # A cell missing (the bench cut off): no pass on half the evidence.
        half = self.write("h.csv", header + "false,ok,128,900,50,49,51,1020,1000,false,20,\n")
        code, fig = self.figure("estimate-offload", self.write("e.json", json.dumps(est)), half)
        self.assertEqual(code, 1)
        self.assertIn("missing_offload", fig)
        # Both peaks within 10 % but the saving not (predicted 50 MiB, measured 140).
        est["ladder"]["rungs"][2]["peak_bytes"] = 950 * mib
        small = self.write("s.csv", header + "false,ok,128,900,50,49,51,1020,1000,false,20,\n"
                                             "true,ok,128,700,60,59,61,880,1000,false,20,\n")
        code, fig = self.figure("estimate-offload", self.write("s.json", json.dumps(est)), small)
        self.assertEqual(code, 1)
        self.assertIn("saving:predicted_50_measured_140_MiB", fig)
        est["ladder"]["rungs"][2]["peak_bytes"] = 800 * mib
        # Not probed (the CPU, or the core refused): a failure, never a figure made up.
        est["ladder"]["rungs"].pop()
        code, fig = self.figure("estimate-offload", self.write("n.json", json.dumps(est)), csv)
        self.assertEqual(code, 1)
        self.assertIn("offload_rung_not_probed", fig)
        self.assertIn("offload:not_predicted", fig)
        # Off by more than 10 %.
        est["ladder"]["rungs"].append(dict(rung, peak_bytes=1000 * mib, offload=True))
        self.assertEqual(self.figure("estimate-offload", self.write("f.json", json.dumps(est)), csv)[0], 1)

    def test_peer_is_the_ratio_of_medians(self):
        peer = {"results": {"trainer": [{"samples_per_s": s} for s in (90, 100, 110)],
                            "cpp": [{"samples_per_s": s} for s in (120, 125, 130)]}}
        self.assertEqual(self.figure("peer", self.write("p.json", json.dumps(peer))),
                         (0, "trainer_100_samples/s_cpp_125_ratio_0.800"))

    def test_pypi_tests_follow_the_fixtures(self):
        def test(name, **props):
            return {"name": name, "properties": [{"name": k, "value": v} for k, v in props.items()]}
        tests = {"tests": [
            test("fixture.hf_venv", FIXTURES_SETUP=["hf_venv"], LABELS=["integration", "pypi"]),
            test("fixture.hf_models", FIXTURES_SETUP=["hf_models"], FIXTURES_REQUIRED=["hf_venv"]),
            test("Bert.LoadsTheirWeights", FIXTURES_REQUIRED=["hf_models"]),
            test("fixture.mlflow_venv", FIXTURES_SETUP=["mlflow_venv"], LABELS="pypi"),
            test("fixture.viz", FIXTURES_SETUP=["viz"], LABELS=["integration"]),
            test("Viz.Reads", FIXTURES_REQUIRED=["viz"]),
            test("fixture.mlflow_server_start", FIXTURES_SETUP=["mlflow_server"], FIXTURES_REQUIRED=["mlflow_venv"]),
            test("fixture.mlflow_server_stop", FIXTURES_CLEANUP=["mlflow_server"]),
            test("Mlflow.Logs/cpu", FIXTURES_REQUIRED=["mlflow_server"]),
            test("fixture.torchvision_files", FIXTURES_SETUP=["torchvision_files"]),
            test("Resnet.Loads", FIXTURES_REQUIRED=["torchvision_files"]),
            test("Config.Parses", LABELS=["unit"]),
        ]}
        code, regex = self.figure("pypi-tests", self.write("t.json", json.dumps(tests)))
        self.assertEqual(code, 0)
        self.assertEqual(regex, r"^(Bert\.LoadsTheirWeights|Mlflow\.Logs/cpu|fixture\.hf_models|fixture\.hf_venv|"
                                r"fixture\.mlflow_server_start|fixture\.mlflow_server_stop|fixture\.mlflow_venv)$")

    def test_pypi_labels_name_a_test_whose_script_calls_pip_outside_them(self):
        venv = self.write("venv.sh", "#!/bin/sh\n# pip from a venv\n\"$1/bin/pip\" install --quiet x==1\n")
        wheel = self.write("wheel.sh", "#!/bin/sh\n\"$1/bin/pip\" download --no-deps y==2 -d \"$2\"\n")
        plain = self.write("plain.py", "print('pip is not called here')\n")

        def test(name, command, **props):
            return {"name": name, "command": command,
                    "properties": [{"name": k, "value": v} for k, v in props.items()]}
        tests = [
            test("fixture.venv", [venv, "/tmp/v"], FIXTURES_SETUP=["venv"], LABELS=["integration", "pypi"]),
            test("fixture.start", ["/bin/sh", venv, "start"], FIXTURES_SETUP=["server"], FIXTURES_REQUIRED=["venv"]),
            test("Plain.Runs", ["/usr/bin/python3", plain]),
        ]
        self.assertEqual(self.figure("pypi-labels", self.write("t.json", json.dumps({"tests": tests}))), (0, ""))
        tests.append(test("fixture.wheel", ["/bin/sh", wheel, "/tmp/w", "/tmp/d"], FIXTURES_SETUP=["wheel"],
                          LABELS="integration"))
        r = subprocess.run([sys.executable, SCRIPT, "pypi-labels", self.write("t.json", json.dumps({"tests": tests}))],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"fixture.wheel ({wheel} calls pip)", r.stderr)
        self.assertNotIn("fixture.start", r.stderr)
        tests[-1]["properties"][1]["value"] = ["integration", "pypi"]
        self.assertEqual(self.figure("pypi-labels", self.write("t.json", json.dumps({"tests": tests})))[0], 0)

    def test_passed_tests_are_read_from_the_log_and_left_out_by_name(self):
        log = self.write("test.log", "\n".join([
            "        Start 12: Oom.Recovers",
            " 1/30 Test #12: Oom.Recovers ....................   Passed   21.50 sec",
            "12/30 Test #3: Cli.Mem/cpu .....***Failed   14.47 sec",
            "13/30 Test #4: fixture.torchvision_files ..   Passed  230.45 sec",
            "[  PASSED  ] 1 test.",
        ]) + "\n")
        code, names = self.figure("passed-tests", log)
        self.assertEqual((code, names.split("\n")), (0, ["Oom.Recovers", "fixture.torchvision_files"]))
        ctest = self.write("t.json", json.dumps({"tests": [{"name": n} for n in
                                                          ["Cli.Mem/cpu", "Oom.Recovers", "Config.Parses", "A.B"]]}))
        a = self.write("a.txt", "# visit 3\nOom.Recovers\n\nCli.Mem/cpu  # a comment\n")
        b = self.write("b.txt", "Oom.Recovers\nA.B\n")

        def index(files, exclude="", label_exclude=""):
            return self.figure("passed-index", ctest + ":" + files, exclude, label_exclude)

        self.assertEqual(index(a), (0, "0,0,0,3,4"))
        self.assertEqual(index(a + ":" + b), (0, "0,0,0,3"))
        every = self.write("c.txt", "Config.Parses\n")
        self.assertEqual(index(a + ":" + b + ":" + every), (0, "none"))
        self.assertEqual(index(self.write("none.txt", "# nothing\n")), (0, ""))
        code, figure = index(self.write("bad.txt", "Oom.Recovers twice\n"))
        self.assertEqual(code, 1)
        self.assertIn("is_not_a_test_name", figure)
        # What ctest's -E and -LE would leave out is left out of the list: ctest numbers -I among
        # the tests those leave, so the list goes alone, numbered among all the tests.
        labelled = self.write("l.json", json.dumps({"tests": [
            {"name": "Cli.Mem/cpu", "properties": [{"name": "LABELS", "value": ["unit"]}]},
            {"name": "OnGpu.Trains", "properties": [{"name": "LABELS", "value": ["cuda"]}]},
            {"name": "fuzz.report.short", "properties": [{"name": "LABELS", "value": "fuzz"}]},
            {"name": "Oom.Recovers"}, {"name": "A.B", "properties": [{"name": "LABELS", "value": ["cudax"]}]}]}))
        self.assertEqual(self.figure("passed-index", labelled + ":" + a, r"^install\.|^fuzz\.", "^cuda$"),
                         (0, "0,0,0,5"))
        self.assertEqual(self.figure("passed-index", labelled + ":" + b, r"^fuzz\.", "^cuda"), (0, "0,0,0,1"))
        self.assertEqual(self.figure("passed-index", labelled + ":" + b, "", ""), (0, "0,0,0,1,2,3"))
        code, figure = self.figure("passed-index", labelled + ":" + a, "(", "")
        self.assertEqual(code, 1)
        self.assertIn("unterminated_subpattern", figure)
        self.assertEqual(self.figure("passed-index", labelled + ":" + a)[0], 1)  # the two expressions are needed
        # A label given as a string decides alone; value-parameterised names, quoted or with
        # gtest's comment, are named by their first word, as passed-tests writes them.
        params = self.write("p.json", json.dumps({"tests": [
            {"name": "Run.Gpu", "properties": [{"name": "LABELS", "value": "cuda"}]},
            {"name": 'Models/Trains.Same/"cnn"'},
            {"name": 'Devices/OnDevice.Resume/cpu  # GetParam() = "cpu"'},
            {"name": "Oom.Recovers"}]}))
        quoted = self.write("q.txt", 'Models/Trains.Same/"cnn"\nDevices/OnDevice.Resume/cpu\n')
        self.assertEqual(self.figure("passed-index", params + ":" + quoted, "", "^cuda$"), (0, "0,0,0,4"))
        log = self.write("p.log", "\n".join([
            ' 1/3 Test #2: Models/Trains.Same/"cnn" ......   Passed    1.0 sec',
            ' 2/3 Test #3: Devices/OnDevice.Resume/cpu  # GetParam() = "cpu" ...   Passed    1.0 sec',
        ]) + "\n")
        self.assertEqual(self.figure("passed-tests", log), (0, 'Devices/OnDevice.Resume/cpu\nModels/Trains.Same/"cnn"'))

    def test_the_committed_list_of_passed_tests_is_readable(self):
        listed = os.path.join(os.path.dirname(os.path.abspath(SCRIPT)), "..", "docs", "gpu-tests-passed.txt")
        with open(listed) as f:
            names = [line.split("#", 1)[0].strip() for line in f]
        names = [n for n in names if n]
        ctest = self.write("t.json", json.dumps({"tests": [{"name": n} for n in names + ["Not.YetRun"]]}))
        self.assertEqual(self.figure("passed-index", ctest + ":" + listed, r"^fuzz\.", "^cuda$"),
                         (0, f"0,0,0,{len(names) + 1}"))

    def test_json_gathers_the_summary(self):
        self.write("summary.txt", "PASS build 51s\nSKIP tests:chromium no headless Chromium\nFAIL cuda-tests 1_skipped\n")
        self.assertEqual(self.figure("json", self.dir.name)[0], 0)
        with open(os.path.join(self.dir.name, "figures.json")) as f:
            data = json.load(f)
        self.assertEqual([c["status"] for c in data["checks"]], ["PASS", "SKIP", "FAIL"])
        self.assertEqual(data["checks"][1], {"check": "tests:chromium", "status": "SKIP",
                                             "figure": "no headless Chromium"})
        self.assertIn("machine", data)


if __name__ == "__main__":
    unittest.main()
