"""payload's worker extension for a pool (issue 37, docs/pools.md): loaded into every vLLM worker with
--worker-extension-cls evalci_pool_ext.PoolWorkerExtension; payload calls its methods through the dev
route POST /collective_rpc (string arguments only). Written into the pool's group dir by payload.

pool_reload  the built-in in-place reload, then the output head's weight processing run again when the
             embeddings are tied: vLLM's CPU build packs lm_head for its GEMM at load time and the reload
             does not repack a tied head (its weight is the embedding's, never "loaded"), so without this
             the engine keeps serving the first model's output projection.
pool_check   every linear layer (and the output head) compared *by function* with the checkpoint's files:
             seeded probe rows through the engine's own kernel (quant_method.apply, the packed weights
             the engine really computes with) against probe @ W.T from the checkpoint; every parameter
             that still holds its tensor (embeddings, norms) compared exactly. Returns JSON.
"""

import glob
import hashlib
import json
import os

import torch


def _checkpoint(weights_path):
    from safetensors import safe_open

    tensors = {}
    for f in sorted(glob.glob(os.path.join(weights_path, "*.safetensors"))):
        with safe_open(f, framework="pt") as h:
            for k in h.keys():
                tensors[k] = h.get_tensor(k)
    return tensors


class PoolWorkerExtension:
    def pool_reload(self, weights_path, repack_head="1"):
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        head = getattr(model, "lm_head", None)
        repacked = False
        if repack_head == "1" and tied and head is not None and getattr(head, "quant_method", None) is not None:
            head.quant_method.process_weights_after_loading(head)
            repacked = True
        return json.dumps({"tied": tied, "repacked_head": repacked})

    @torch.inference_mode()
    def pool_check(self, weights_path, tolerance="0.02"):
        tol = float(tolerance)
        model = self.model_runner.get_model()
        ckpt = _checkpoint(weights_path)
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        digest = hashlib.sha1()
        for k in sorted(ckpt):
            digest.update(k.encode())
            digest.update(ckpt[k].contiguous().view(torch.uint8).numpy().tobytes())

        def source(weight_name):
            if weight_name in ckpt:
                return ckpt[weight_name]
            if weight_name == "lm_head.weight" and tied:
                return ckpt.get("model.embed_tokens.weight")
            for fused, parts in packed.items():
                if f".{fused}." in weight_name:
                    pieces = [ckpt.get(weight_name.replace(f".{fused}.", f".{p}.")) for p in parts]
                    if all(p is not None for p in pieces):
                        return torch.cat(pieces, dim=0)
            return None

        gen = torch.Generator().manual_seed(37)
        mismatches, unmatched = [], []
        layers = exact = 0
        worst = 0.0
        for name, mod in model.named_modules():
            method = getattr(mod, "quant_method", None)
            weight = getattr(mod, "weight", None)
            if method is None or weight is None or not hasattr(method, "apply"):
                continue
            want_w = source(f"{name}.weight")
            if want_w is None:
                unmatched.append(name)
                continue
            if want_w.dim() != 2:
                continue
            k = want_w.shape[1]
            probe = torch.randn(4, k, generator=gen).to(torch.bfloat16)
            got = method.apply(mod, probe).float()[:, : want_w.shape[0]]
            want = torch.nn.functional.linear(probe.float(), want_w.float())
            rel = float((got - want).abs().max() / want.abs().max().clamp(min=1e-6))
            worst = max(worst, rel)
            layers += 1
            if rel > tol:
                mismatches.append(f"{name}: relative difference {rel:.3g}")
        for name, param in model.named_parameters():
            if param.numel() == 0:
                continue
            want_p = source(name)
            if want_p is None:
                continue
            if want_p.shape == param.shape:
                if torch.equal(param.detach().to(want_p.dtype).cpu(), want_p):
                    exact += 1
                else:
                    mismatches.append(f"{name}: differs from the checkpoint")
        return json.dumps(
            {
                "checkpoint_sha1": digest.hexdigest(),
                "layers_by_function": layers,
                "parameters_exact": exact,
                "max_relative_difference": worst,
                "mismatches": mismatches,
                "unmatched": unmatched,
            }
        )
