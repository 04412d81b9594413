"""The entry point of the rayslice component package (PulumiPlugin.yaml beside this file).

`pulumi package add` and every `pulumi up` of a program that uses the package run this file
(``python <repository> <engine address>``): it starts the provider, which prints the port it
serves on. Everything else lives in `rayslice.infra.provider`.
"""

from rayslice.infra.provider import serve

if __name__ == "__main__":
    serve()
