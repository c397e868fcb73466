def test_probe():
    import privstream.mechanisms.oracles as o
    print(o.__file__)
