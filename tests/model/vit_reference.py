# Prints the reference values vit_test.cpp checks against, from Debian's python3-torchvision
# (0.14): the state_dict names and shapes of a tiny ViT and the parameter count of ViT-B/16.
#   /usr/bin/python3 tests/model/vit_reference.py
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

m = VisionTransformer(image_size=28, patch_size=7, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                      num_classes=10)
for name, tensor in m.state_dict().items():
    print(name, list(tensor.shape))
print("vit_b_16 parameters:", sum(p.numel() for p in torchvision.models.vit_b_16().parameters()))
