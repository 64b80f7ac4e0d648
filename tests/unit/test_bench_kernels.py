"""`dlrt bench kernels` refuses a machine without a CUDA GPU in one `error:` line, status 2."""

import pytest
import torch

from dlrt.entrypoints.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_without_a_gpu_one_error_line(tiny_sdar, capsys):
    assert main(["bench", "kernels", "--model", str(tiny_sdar), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "error: dlrt bench kernels needs a CUDA GPU\n"
