"""Reads a directory of TensorBoard event files with TensorBoard's own EventAccumulator (which
checks every record's CRC) and prints what it holds as JSON: the scalars (step, wall time,
value) by tag, and the HParams plugin's session start (hyper-parameters) and end (status)."""
import json
import math
import sys

from google.protobuf import json_format
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2


def number(v):
    return v if math.isfinite(v) else str(v)


def main(logdir):
    ea = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    out = {"scalars": {}, "hparams": None, "status": None}
    for tag in ea.Tags()["scalars"]:
        out["scalars"][tag] = [[e.step, e.wall_time, number(e.value)] for e in ea.Scalars(tag)]
    try:
        hparams = ea.PluginTagToContent("hparams")
    except KeyError:  # no HParams summary in the files
        hparams = {}
    for tag, content in hparams.items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            out["hparams"] = json_format.MessageToDict(data.session_start_info)["hparams"]
        if data.HasField("session_end_info"):
            out["status"] = api_pb2.Status.Name(data.session_end_info.status)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
